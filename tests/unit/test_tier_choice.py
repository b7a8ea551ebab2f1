"""The router's choice of tier on a table written out by hand: prices of one record's tokens,
turnarounds and the time it has left; and a tier's turnaround learned from its completions."""

from __future__ import annotations

import pytest

from consumers.ai.tier_choice import Offer, Turnaround, choose, fallback_at
from measure.cost import Prices

TOKENS = (1000, 200)  # input, expected output
# 1000 / 1000 x input + 200 / 1000 x output:
REALTIME = Offer("realtime", Prices(0.0025, 0.01), 5.0)  # 0.0025 + 0.0020 = 0.0045
FLEX = Offer("flex", Prices(0.0015, 0.006), 60.0)  # 0.0015 + 0.0012 = 0.0027
BATCH = Offer("batch", Prices(0.00125, 0.005), 3600.0)  # 0.00125 + 0.0010 = 0.00225
RESERVE_S = 10.0  # a realtime call's time kept for the fallback


@pytest.mark.parametrize(("time_left_s", "chosen"), [
    (None, "realtime"),  # no deadline: nobody said it can wait
    (5.0, "realtime"),  # too late even for realtime's reserve: served at once
    (69.9, "realtime"),  # flex needs 60 + 10
    (70.0, "flex"),  # 60 + 10 fits exactly; 0.0027 < 0.0045
    (3609.0, "flex"),  # batch needs 3600 + 10
    (3610.0, "batch"),  # 0.00225, the cheapest
    (86400.0, "batch"),
])
def test_the_cheapest_tier_that_leaves_the_deadline_met_with_a_fallback_in_hand(
        time_left_s: float | None, chosen: str) -> None:
    assert choose([REALTIME, FLEX, BATCH], TOKENS, time_left_s, RESERVE_S) == chosen


def test_a_tier_no_cheaper_than_realtime_is_not_taken_and_realtime_is_always_offered() -> None:
    same_price = Offer("flex", REALTIME.prices, 1.0)
    assert choose([same_price, REALTIME], TOKENS, 100.0, RESERVE_S) == "realtime"
    with pytest.raises(ValueError, match="realtime is always offered"):
        choose([FLEX, BATCH], TOKENS, 100.0, RESERVE_S)


def test_a_record_not_answered_falls_back_a_realtime_call_before_its_deadline() -> None:
    assert fallback_at(1000.0, RESERVE_S) == 990.0


def test_the_turnaround_is_the_declared_window_until_five_completions_then_their_95th_percentile() -> None:
    turnaround = Turnaround(3600.0)
    for took in (100.0, 200.0, 300.0, 400.0):
        turnaround.ended(took)
    assert turnaround.expected_s() == 3600.0
    turnaround.ended(500.0)
    # 100 ... 500, inclusive: rank 0.95 x 4 = 3.8, 400 + 0.8 x 100
    assert turnaround.expected_s() == pytest.approx(480.0)
    for _ in range(50):  # the last 50 only: the first five leave
        turnaround.ended(60.0)
    assert turnaround.expected_s() == 60.0
    with pytest.raises(ValueError):
        Turnaround(0.0)
