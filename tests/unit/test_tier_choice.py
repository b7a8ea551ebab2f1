"""The router's choice of tier on a table written out by hand: prices of one record's tokens,
turnarounds and the time it has left; a tier's turnaround learned from its completions; and
the shipped support tickets' drafts routed by their deadlines."""

from __future__ import annotations

import pytest

from consumers.ai.tier_choice import Offer, Turnaround, choose, fallback_at
from consumers.config import pipeline_spec
from consumers.runtime.tier_router import TierRouter
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
    turnaround.learned([100.0, 200.0, 300.0, 400.0])
    assert turnaround.expected_s() == 3600.0
    turnaround.learned([100.0, 200.0, 300.0, 400.0, 500.0])
    # 100 ... 500, inclusive: rank 0.95 x 4 = 3.8, 400 + 0.8 x 100
    assert turnaround.expected_s() == pytest.approx(480.0)
    turnaround.learned([100.0, 200.0, 300.0, 400.0, 500.0] + [60.0] * 50)  # the last 50 only
    assert turnaround.expected_s() == 60.0
    with pytest.raises(ValueError):
        Turnaround(0.0)


# The shipped support_tickets' draft: batch at 3,600 s declared and flex at 60 s, both at half
# the price; at time scale 0.01 they are 36 s and 0.6 s, and a fallback's realtime call is given 6 s.
def router() -> TierRouter:
    spec = pipeline_spec.load("support_tickets")
    found = TierRouter.of(spec.stages["draft"], spec.endpoints["large_model"], 0.01, lambda: 6.0)
    assert found is not None
    return found


BODY = {"model": "large-model", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 160}


@pytest.mark.parametrize(("within_s", "now", "batches", "flex_calls", "chosen"), [
    (None, 1000.0, [], [], None),  # the ticket says nothing: drafted at once
    (0, 1000.0, [], [], None),  # not a wait
    (True, 1000.0, [], [], None),  # not a number of seconds
    # due at 1000 + 5000 x 0.01 = 1050: 50 s left, 36 + 6 = 42 fit; falls back at 1050 - 6
    (5000, 1000.0, [], [], "batch"),
    (5000, 1008.0, [], [], "batch"),  # 42 s left: fits exactly
    (5000, 1009.0, [], [], "flex"),  # 41 s left: batch no more, flex's 0.6 + 6 fits; same price as batch
    # five batches took 10 s: their 95th percentile, 10 + 6 = 16, fits the 20 s left
    (5000, 1030.0, [10.0] * 5, [], "batch"),
    (5000, 1035.0, [10.0] * 5, [], "flex"),  # 15 s left
    (5000, 1043.0, [], [], "flex"),  # 7 s left: 0.6 + 6 = 6.6 fits
    (5000, 1043.5, [], [], "realtime"),  # 6.5 s left
    # five flex calls took 2 s: 2 + 6 = 8
    (5000, 1042.0, [], [2.0] * 5, "flex"),
    (5000, 1042.1, [], [2.0] * 5, "realtime"),
])
def test_a_ticket_goes_to_the_cheapest_tier_whose_learned_turnaround_and_a_fallback_fit(
        within_s: object, now: float, batches: list[float], flex_calls: list[float],
        chosen: str | None) -> None:
    routing = router()
    routing.turnarounds["batch"].learned(batches)
    for seconds in flex_calls:
        routing.flex_answered(seconds)
    event = {"ticket_id": "t1", "produced_at": 1000.0,
             **({} if within_s is None else {"answer_within_s": within_s})}
    found = routing.choose(event, BODY, now)
    assert (None if found is None else found.tier) == chosen
    if found is not None:
        assert (found.deadline_at, found.fallback_at) == (1050.0, 1044.0)


def test_a_stage_without_a_deadline_or_a_later_tier_has_no_router() -> None:
    spec = pipeline_spec.load("support_tickets")
    assert TierRouter.of(spec.stages["triage"], spec.endpoints["small_model"], 1.0, lambda: 6.0) is None
    flex_only = spec.stages["draft"].model_copy(update={"tiers": ["realtime", "flex"]})
    only = TierRouter.of(flex_only, spec.endpoints["large_model"], 1.0, lambda: 6.0)
    assert only is not None and list(only.turnarounds) == ["flex"]
