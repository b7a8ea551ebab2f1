"""The per-minute budgets a client spends before each try, on a hand-driven clock."""

from __future__ import annotations

import pytest

from consumers.ai.client import CONCURRENCY, refusal_kind
from consumers.ai.rate_budget import REQUESTS, TOKENS, Estimate, RateBudget, duration_s


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_declared_budget_is_spent_then_refilled_over_its_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    monkeypatch.setattr("consumers.ai.rate_budget.time.sleep", sleep)
    # 6 requests a minute of 3 s (time scale 0.05): a full bucket, then one every 0.5 s.
    budget = RateBudget(requests_per_minute=6, minute_s=3.0, clock=clock)
    for _ in range(6):
        budget.take(0)
    assert slept == []
    budget.take(0)
    assert slept == [pytest.approx(0.5)]


def test_tokens_wait_for_the_estimate_and_the_answer_corrects_it(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("consumers.ai.rate_budget.time.sleep", lambda s: setattr(clock, "now", clock.now + s))
    budget = RateBudget(tokens_per_minute=600, clock=clock)  # 10 tokens a second
    payload = {"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 100}
    # "user" and 400 characters: 404 / 4 = 101 tokens of prompt, and max_tokens 100
    assert budget.estimate(payload) == Estimate(101, 201)
    budget.take(500)  # 100 left
    budget.settle(Estimate(101, 500), {"usage": {"completion_tokens": 20, "total_tokens": 121}})
    # 500 estimated, 121 used: 379 back, 479 left; a try of 500 waits for 21 tokens: 2.1 s.
    budget.take(500)
    assert clock.now == pytest.approx(2.1)


def test_announced_budgets_are_learned_with_their_refill_from_the_reset() -> None:
    clock = Clock()
    budget = RateBudget(clock=clock)
    assert budget.known == {}
    # 60 a minute announced, 30 left, full again in 7.5 s: the 30 spent refill in 7.5 s, so
    # the endpoint's minute is 15 s (a time scale of 0.25).
    budget.observe({"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "30",
                    "x-ratelimit-reset-requests": "7.5s"})
    assert budget.known == {REQUESTS: 60}
    assert budget._buckets[REQUESTS].window_s == pytest.approx(15.0)
    assert budget._buckets[REQUESTS].level == 30


def test_a_budget_refusal_empties_the_bucket_until_its_retry_after() -> None:
    clock = Clock()
    budget = RateBudget(requests_per_minute=60, clock=clock)
    budget.refused(REQUESTS, 2.0, {})
    bucket = budget._buckets[REQUESTS]
    assert bucket.wait_for(1, clock.now) == pytest.approx(2.0)  # held, though 1 s would refill one
    clock.now = 2.0
    assert bucket.wait_for(1, clock.now) == 0


@pytest.mark.parametrize(("body", "headers", "kind"), [
    (b'{"error": {"type": "tokens", "code": "rate_limit_exceeded"}}', {}, TOKENS),
    (b'{"error": {"type": "concurrency"}}', {"x-ratelimit-remaining-requests": "0"}, CONCURRENCY),
    (b'{"error": {"message": "No deployments available for selected model"}}',
     {"x-ratelimit-remaining-requests": "0"}, REQUESTS),
    (b'{"error": {"type": "throttling_error", "message": "litellm.RateLimitError: Model rate limit '
     b'exceeded. RPM limit=120, current usage=121"}}', {}, REQUESTS),
    (b'{"error": {"type": "throttling_error", "message": "Model rate limit exceeded. TPM limit=60000"}}',
     {}, TOKENS),
    (b'{"error": {"code": "rate_limit_exceeded", "message": "Rate limit reached for small-model on '
     b'requests per min (RPM): Limit 600"}}', {}, REQUESTS),
    (b'{"error": {"message": "Too many requests in flight"}}', {}, CONCURRENCY),
    (b"not json", {}, CONCURRENCY),
])
def test_a_429_is_read_by_what_ran_out(body: bytes, headers: dict, kind: str) -> None:
    assert refusal_kind(body, headers) == kind


def test_reset_durations_read_as_openai_writes_them() -> None:
    assert [duration_s(v) for v in ("12ms", "1.5s", "6m0s", "1h2m3.5s", "2", None)] == \
        [0.012, 1.5, 360.0, 3723.5, 2.0, None]


def test_a_meter_of_clock_minutes_costs_a_handful_of_429s_not_one_per_refill() -> None:
    """A gateway that counts each clock minute's requests, refused ones included, and says
    neither when it resets nor Retry-After (LiteLLM's proxy): 120 a minute."""
    clock = Clock()
    budget = RateBudget(clock=clock)
    minute, counted, served, refused = 0, 0, 0, []
    while clock.now < 180:
        wait = budget.try_take(0)
        if wait > 0:
            clock.now += wait
            continue
        if clock.now // 60 != minute:
            minute, counted = int(clock.now // 60), 0
        counted += 1
        if counted <= 120:
            served += 1
            budget.observe({"x-ratelimit-limit-requests": "120",
                            "x-ratelimit-remaining-requests": str(120 - counted)})
        else:
            refused.append(clock.now)
            budget.refused(REQUESTS, None, {})
        clock.now += 0.001  # a try's round trip
    # The first minute's 120 go at once (the bucket learned full) and the refill's next try
    # overflows it at 0.62 s; then holds of 0.6, 1.2, 2.4, 4.8, 9.6, 15 and 15 s (a quarter
    # minute at most) bring the eighth refusal at 49.2 s and the first try of the next minute at
    # 64.2 s; from then on 2 a second fill each minute without a refusal: 120 + 112 + 120.
    assert [round(t, 1) for t in refused] == [0.6, 1.2, 2.4, 4.8, 9.6, 19.2, 34.2, 49.2]
    assert served == 352
