"""The stand-in's per-minute budgets: buckets, token counts and OpenAI's header values, by hand."""

from __future__ import annotations

import pytest

from consumers.ai.rate_budget import tokens_of
from consumers.stand_in.budgets import Bucket, Budgets, Shortfall, metered, openai_duration


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "0s"), (-1.0, "0s"), (0.012, "12ms"), (0.0015, "1.5ms"), (0.5, "500ms"), (1.0, "1s"),
    (1.5, "1.5s"), (17.765, "17.765s"), (59.9999, "1m0s"), (90.0, "1m30s"), (360.0, "6m0s"),
    (3723.5, "1h2m3.5s"), (0.9999999, "1s"),
])
def test_durations_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert openai_duration(seconds) == text


def test_tokens_are_a_quarter_of_the_characters_rounded_up() -> None:
    assert [tokens_of("x" * n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert [metered(kind, 7, 5) for kind in ("input", "output", "total")] == [7, 5, 12]


def test_a_bucket_starts_full_and_refills_per_minute_over_the_time_scale() -> None:
    bucket = Bucket(60, now=0.0)  # 1 per real-scale second; at 0.5x, 2 per wall second
    assert (bucket.remaining, bucket.wait_s(60, 0.5), bucket.reset_s(0.5)) == (60, 0.0, 0.0)
    bucket.level -= 60
    assert bucket.wait_s(1, 0.5) == 0.5
    assert bucket.reset_s(0.5) == 30.0  # 60 units at 2 per second
    bucket.refill(0.25, 0.5)
    assert (bucket.level, bucket.remaining, bucket.wait_s(1, 0.5)) == (0.5, 0, 0.25)
    bucket.refill(100.0, 0.5)
    assert bucket.level == 60.0  # never above its capacity
    assert bucket.wait_s(61, 0.5) is None  # more than a whole minute's budget: never


def test_budgets_name_the_budget_with_the_longest_wait() -> None:
    budgets = Budgets(requests_per_minute=6, tokens_per_minute=600, now=0.0)  # 0.1 and 10 per second
    assert budgets.shortfall(600, 1.0) is None
    budgets.take(595)
    budgets.take(0)
    assert (budgets.requests.level, budgets.tokens.level) == (4.0, 5.0)  # type: ignore[union-attr]
    assert budgets.shortfall(25, 1.0) == Shortfall("tokens", 2.0)  # 20 short at 10/s; requests pass
    budgets.take(5)
    budgets.take(0)
    budgets.take(0)
    budgets.take(0)  # requests empty now: 1 short at 0.1/s = 10 s, tokens 10 short = 1 s
    assert budgets.shortfall(10, 1.0) == Shortfall("requests", 10.0)
    too_large = budgets.shortfall(601, 1.0)
    assert too_large is not None and (too_large.kind, too_large.wait_s) == ("tokens", None)
    assert "601 tokens needed" in too_large.message


def test_a_correction_refunds_an_estimate_and_never_overfills() -> None:
    budgets = Budgets(requests_per_minute=None, tokens_per_minute=60, now=0.0)  # 1 token per second
    budgets.take(50)
    budgets.correct(charged=50, actual=12, now=2.0, scale=1.0)  # 10 + 2 refilled + 38 back
    assert budgets.tokens is not None and budgets.tokens.level == 50.0
    budgets.correct(charged=50, actual=0, now=2.0, scale=1.0)
    assert budgets.tokens.level == 60.0
    budgets.correct(charged=0, actual=70, now=2.0, scale=1.0)  # an answer longer than estimated
    assert (budgets.tokens.level, budgets.tokens.remaining) == (-10.0, 0)


def test_headers_are_openais_for_each_declared_budget_only() -> None:
    budgets = Budgets(requests_per_minute=60, tokens_per_minute=None, now=0.0)
    budgets.take(0)
    assert budgets.headers(0.5) == {"x-ratelimit-limit-requests": "60",
                                    "x-ratelimit-remaining-requests": "59",
                                    "x-ratelimit-reset-requests": "500ms"}  # 1 at 2 per wall second
    both = Budgets(requests_per_minute=3, tokens_per_minute=40000, now=0.0)
    both.take(1000)  # requests: 1 at 0.05/s = 20 s; tokens: 1000 at 666.67/s = 1.5 s
    assert both.headers(1.0) == {
        "x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "2",
        "x-ratelimit-reset-requests": "20s",
        "x-ratelimit-limit-tokens": "40000", "x-ratelimit-remaining-tokens": "39000",
        "x-ratelimit-reset-tokens": "1.5s",
    }
    assert Budgets(None, None, now=0.0).headers(1.0) == {}
