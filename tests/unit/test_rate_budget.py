"""The per-minute budgets a client spends before each try, on a hand-driven clock."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter

import pytest

from consumers.ai.admission import CONCURRENCY
from consumers.ai.meters import PeriodBudget, RefilledBudget
from consumers.ai.rate_budget import REQUESTS, TOKENS, Estimate, RateBudget, Spent, duration_s
from consumers.ai.reply import refusal_kind
from tests.hand_clock import HandClock


def test_a_declared_budget_is_spent_then_refilled_over_its_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = HandClock()
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
    clock = HandClock()
    monkeypatch.setattr("consumers.ai.rate_budget.time.sleep", lambda s: setattr(clock, "now", clock.now + s))
    budget = RateBudget(tokens_per_minute=600, clock=clock)  # 10 tokens a second
    payload = {"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 100}
    # "user" and 400 characters: 404 / 4 = 101 tokens of prompt, and max_tokens 100
    assert budget.estimate(payload) == Estimate(101, 201)
    spent = budget.take(500)  # 100 left
    budget.settle(spent, Estimate(101, 500), {"usage": {"completion_tokens": 20, "total_tokens": 121}})
    # 500 estimated, 121 used: 379 back, 479 left; a try of 500 waits for 21 tokens: 2.1 s.
    budget.take(500)
    assert clock.now == pytest.approx(2.1)


def test_announced_budgets_are_learned_with_their_refill_from_the_reset() -> None:
    clock = HandClock()
    budget = RateBudget(clock=clock)
    assert budget.known == {}
    # 60 a minute announced, 30 left, full again in 7.5 s: the 30 spent refill in 7.5 s, so
    # the endpoint's minute is 15 s (a time scale of 0.25).
    budget.observe({"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "30",
                    "x-ratelimit-reset-requests": "7.5s"}, budget.take(0))
    assert budget.known == {REQUESTS: 60}
    assert budget._budgets[REQUESTS].period_s == pytest.approx(15.0)
    assert budget._budgets[REQUESTS].level == 30


def openai(remaining: int) -> dict[str, str]:
    """OpenAI's headers for 60 requests a minute, `remaining` left, one refilled a second."""
    return {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": f"{60 - remaining}s"}


def test_what_the_meter_never_charged_comes_back_with_an_answer_to_a_later_try() -> None:
    budget = RateBudget(clock=HandClock())  # the clock stands still: nothing refills
    first = budget.take(0)
    budget.observe(openai(59), first)
    level = budget._budgets[REQUESTS]
    b, c, d = budget.take(0), budget.take(0), budget.take(0)
    assert level.level == 56
    # c and d are refused as too many at once: the meter charged neither and holds 58.
    budget.ended(c, answered=False)
    budget.ended(d, answered=False)
    # b's answer: c and d went after it, and the meter may yet have charged them: 56 stays.
    budget.observe(openai(58), b)
    assert level.level == 56
    e = budget.take(0)  # 55 to us, 57 at the meter
    budget.observe(openai(57), e)  # nothing of ours went after e: 57
    assert level.level == 57
    # An answer overtaken by others announces more than is left: never above our count.
    budget.observe(openai(59), first)
    assert level.level == 57


def test_a_budget_refusal_empties_the_bucket_until_its_retry_after() -> None:
    clock = HandClock()
    budget = RateBudget(requests_per_minute=60, clock=clock)
    budget.refused(REQUESTS, 2.0, {}, budget.take(0))
    bucket = budget._budgets[REQUESTS]
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


def gateway(limit: int, remaining: int) -> dict[str, str]:
    """What LiteLLM's proxy announces with an answer: a limit and what remains, no reset."""
    return {"x-ratelimit-limit-requests": str(limit), "x-ratelimit-remaining-requests": str(remaining)}


def test_a_budget_announced_with_a_reset_is_a_refilled_bucket_and_without_one_a_fixed_period() -> None:
    budget = RateBudget(clock=HandClock())
    budget.observe({**gateway(120, 100), "x-ratelimit-limit-tokens": "60000",
                    "x-ratelimit-remaining-tokens": "50000", "x-ratelimit-reset-tokens": "10s"},
                   budget.take(0))
    assert isinstance(budget._budgets[REQUESTS], PeriodBudget)
    assert isinstance(budget._budgets[TOKENS], RefilledBudget)


def test_a_full_bucket_announcing_a_reset_of_nothing_is_still_a_refilled_bucket() -> None:
    budget = RateBudget(clock=HandClock())  # a first answer from an idle meter: full, so full again in 0 s
    budget.observe({"x-ratelimit-limit-tokens": "16000", "x-ratelimit-remaining-tokens": "16000",
                    "x-ratelimit-reset-tokens": "0s"}, budget.take(0))
    assert isinstance(budget._budgets[TOKENS], RefilledBudget)


def test_a_fixed_period_is_spent_evenly_and_its_turn_learned_from_the_answers() -> None:
    clock = HandClock()
    budget = RateBudget(clock=clock)
    first = budget.take(0)  # nothing known yet: it goes at once
    clock.now = 1.0
    budget.ended(first, answered=True)
    budget.observe(gateway(120, 60), first)
    period = budget._budgets[REQUESTS]
    assert isinstance(period, PeriodBudget)
    # 60 left of a period seen at 1 s, which ends by 61 s at the latest: one try a second.
    assert budget.try_take(0)[0] == 0
    assert budget.try_take(0)[0] == pytest.approx(1.0)
    clock.now = 2.0
    second = budget.take(0)
    clock.now = 10.0
    budget.ended(second, answered=True)
    # 119 remaining where our two answers since would leave 58: the period turned after the
    # answer at 1 s, by 10 s. The next ends by 70 s, maybe 9 s earlier: no try goes after 61 s.
    # The try still out (sent at 1 s) is counted to the new period: 118 left.
    budget.observe(gateway(120, 119), second)
    assert (period.ends, period.margin, period.level) == (70.0, 9.0, 118.0)
    assert list(budget.changes) == [(1.0, REQUESTS, 120.0, False), (10.0, REQUESTS, 120.0, True)]
    third = budget.take(0)
    clock.now = 20.0
    budget.ended(third, answered=False)
    budget.refused(REQUESTS, None, {}, third)  # spent after all (others' calls): held until it turns
    assert budget.try_take(0)[0] == pytest.approx(50.0)
    clock.now = 70.0
    assert budget.try_take(0)[0] == 0 and period.level == 119


def test_a_refusal_from_a_period_already_over_says_nothing_of_the_current_one() -> None:
    clock = HandClock()
    budget = RateBudget(clock=clock)
    budget.observe(gateway(120, 119), budget.take(0))  # a period that ends by 60 s
    late = budget.take(0)
    clock.now = 60.5
    budget.ended(late, answered=False)
    budget.refused(REQUESTS, None, {}, late)
    assert budget.try_take(0)[0] == 0


def clock_minute_meter(limit: int, start: float, until: float, members: int, calls: int,
                       latencies: tuple[float, ...]) -> tuple[Counter[int], list[float]]:
    """LiteLLM's proxy in front of a service: each clock minute it counts the tries that reach
    it, refused ones too, and refuses those past `limit`; with each answer it announces the
    limit and what remains, counted on the answers of the clock minute the answer leaves in
    (so a try counted in one minute may be announced in the next), and says neither when it
    resets nor Retry-After. `members` of a fleet share one budget, each with `calls` at once
    and unlimited work, from `start` (seconds into a clock minute) until `until`; the tries
    take `latencies` in turn, 10 ms each way on top, and a refused member backs off 0.5 s.
    Returns the tries served per clock minute (by when the meter counted them) and when each
    refusal came back."""
    clock = HandClock(start)
    budget = RateBudget(clock=clock)
    counted: Counter[int] = Counter()
    served: Counter[int] = Counter()
    announced: Counter[int] = Counter()
    refusals: list[float] = []
    events: list[tuple[float, int, str, int, Spent | None]] = []
    order = itertools.count()
    free = dict.fromkeys(range(members), calls)
    wake = -math.inf
    while clock.now < until:
        for member in free:
            while free[member]:
                wait, spent = budget.try_take(0)
                if spent is None:
                    if not clock.now < wake <= clock.now + wait:
                        wake = clock.now + wait
                        heapq.heappush(events, (wake, next(order), "wake", member, None))
                    break
                free[member] -= 1
                n, arrives = next(order), clock.now + 0.01
                minute = math.floor(arrives / 60)
                counted[minute] += 1
                if counted[minute] > limit:
                    heapq.heappush(events, (arrives + 0.01, n, "refused", member, spent))
                else:
                    served[minute] += 1
                    answers = arrives + latencies[n % len(latencies)]
                    heapq.heappush(events, (answers, n, "answer", member, spent))
        clock.now, n, what, member, spent = heapq.heappop(events)
        if what == "answer" and spent is not None:
            minute = math.floor((clock.now - 0.01) / 60)
            announced[minute] += 1
            budget.ended(spent, answered=True)
            budget.observe(gateway(limit, limit - announced[minute]), spent)
            free[member] += 1
        elif what == "refused" and spent is not None:
            refusals.append(clock.now)
            budget.ended(spent, answered=False)
            budget.refused(REQUESTS, None, {}, spent)
            heapq.heappush(events, (clock.now + 0.5, n, "backed off", member, None))
        elif what == "backed off":
            free[member] += 1
    return served, refusals


LATENCIES = (1.0, 2.2, 1.4, 3.1, 1.7, 1.2, 2.6)  # s, in turn: answers overtake each other


@pytest.mark.parametrize("start", [0.5, 20.0, 37.0, 59.99])
def test_a_meter_of_clock_minutes_is_used_whole_from_its_first_turn_without_a_refusal(start: float) -> None:
    """120 a minute, 4 members of 16 calls each, starting anywhere in a clock minute."""
    served, refusals = clock_minute_meter(120, start, start + 300, members=4, calls=16, latencies=LATENCIES)
    # The first turn seen in the answers counts the tries out then to the new minute (at most
    # the 2 a second of the last 3.1 s sent at the minute's pace: 7), and so may the second,
    # should the first come before any answer; from then on each minute serves its whole 120.
    assert refusals == []
    assert served[1] >= 120 - 7 and served[2] >= 120 - 7
    assert [served[3], served[4]] == [120, 120]


def test_a_first_burst_past_the_limit_is_refused_only_until_the_first_answer() -> None:
    """64 calls at once against 60 a minute: the 4 past it, and their tries again every 0.5 s
    until the first answer (at 1.02 s) announces the budget, are the only refusals."""
    served, refusals = clock_minute_meter(60, 0.5, 300.5, members=4, calls=16, latencies=LATENCIES)
    assert len(refusals) == 8 and max(refusals) < 0.5 + 1.02
    assert served[0] == 60 and min(served[1], served[2]) >= 60 - 7  # as above
    assert [served[3], served[4]] == [60, 60]
