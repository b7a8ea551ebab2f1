"""A quota's division among its holders, worked by hand."""

from __future__ import annotations

import pytest

from consumers.quota.allocation import Claim, allocate, whole
from consumers.quota.leases import CALLS, REQUESTS, Holding, Limits, next_grant


def claim(holder: str, demand: float, weight: float = 1.0, lane: str = "standard",
          pipeline: str | None = None) -> Claim:
    return Claim(holder, pipeline or holder, lane, weight, demand)


def test_backlogged_pipelines_share_by_weight() -> None:
    # 64 by 2 : 1 : 1, everyone asking for more than all of it: 32, 16, 16.
    shares = allocate(64, [claim("a", 100, 2), claim("b", 100), claim("c", 100)])
    assert shares == pytest.approx({"a": 32, "b": 16, "c": 16})


def test_what_a_pipeline_does_not_ask_for_goes_to_the_others_by_weight() -> None:
    # c asks for 4 of its 16: the 60 left go 2 : 1 to a and b, 40 and 20.
    shares = allocate(64, [claim("a", 100, 2), claim("b", 100), claim("c", 4)])
    assert shares == pytest.approx({"a": 40, "b": 20, "c": 4})


def test_water_filling_takes_several_rounds_when_shares_sate_in_turn() -> None:
    # 30 among four equal weights: d asks 2 (sated first, 28 left for three: 9.33 each),
    # c asks 8 (sated next, 20 left for two), a and b then 10 each.
    shares = allocate(30, [claim("a", 50), claim("b", 50), claim("c", 8), claim("d", 2)])
    assert shares == pytest.approx({"a": 10, "b": 10, "c": 8, "d": 2})


def test_nobody_asking_leaves_the_quota_unallocated() -> None:
    assert allocate(64, [claim("a", 3), claim("b", 5)]) == pytest.approx({"a": 3, "b": 5})


def test_lanes_are_served_in_strict_priority() -> None:
    # interactive takes its 40, standard the 24 left (split 2 : 1 by weight), batch nothing.
    shares = allocate(64, [claim("i", 40, lane="interactive"), claim("s1", 100, 2), claim("s2", 100),
                           claim("b", 100, lane="batch")])
    assert shares == pytest.approx({"i": 40, "s1": 16, "s2": 8, "b": 0})


def test_a_lane_s_reservation_is_kept_from_the_lanes_above() -> None:
    # batch reserves 1/8 of 64 = 8; interactive asks for all: it gets the other 56.
    shares = allocate(64, [claim("i", 100, lane="interactive"), claim("b", 100, lane="batch")],
                      reserves={"batch": 0.125})
    assert shares == pytest.approx({"i": 56, "b": 8})


def test_an_unused_reservation_goes_to_the_other_lanes() -> None:
    # batch reserves 8 but asks for 2: interactive gets 62.
    shares = allocate(64, [claim("i", 100, lane="interactive"), claim("b", 2, lane="batch")],
                      reserves={"batch": 0.125})
    assert shares == pytest.approx({"i": 62, "b": 2})


def test_a_pipeline_s_holders_share_its_share_equally() -> None:
    # p (weight 1) and q (weight 1) split 48: q's 24 among its three fleets, one asking 4:
    # 4, then 10 and 10.
    shares = allocate(48, [claim("p1", 100, pipeline="p"), claim("q1", 100, pipeline="q"),
                           claim("q2", 100, pipeline="q"), claim("q3", 4, pipeline="q")])
    assert shares == pytest.approx({"p1": 24, "q1": 10, "q2": 10, "q3": 4})


def test_whole_calls_by_largest_remainder_within_the_capacity() -> None:
    # 10 by 1 : 1 : 1 is 3.33 each: floors 3, 3, 3 and the one call left to the first by name.
    assert whole({"b": 10 / 3, "a": 10 / 3, "c": 10 / 3}, 10) == {"a": 4, "b": 3, "c": 3}
    # a share already whole gets nothing more, even with calls left.
    assert whole({"a": 2.0, "b": 1.5}, 10) == {"a": 2, "b": 2}


def holding(holder: str, demand: float, granted: float = 0.0, in_use: int = 0, live: bool = True,
            weight: float = 1.0) -> Holding:
    return Holding(holder, holder, "standard", weight, {CALLS: demand}, {CALLS: granted}, in_use, live)


def test_a_grant_grows_only_into_what_the_others_leave_free() -> None:
    # b's fair share of 64 beside a (weight 1, backlogged) is 32, but a still holds 50: b may
    # take the 14 left, and the rest once a has recorded giving it up.
    grant = next_grant(Limits(calls=64), holding("b", 100, granted=0),
                       [holding("a", 100, granted=50, in_use=50)])
    assert grant.use == grant.held == {CALLS: 14}


def test_a_lower_share_applies_at_once_but_is_held_as_the_calls_still_out() -> None:
    # a's share is now 32, 40 of its calls are still out: it starts no call until fewer than
    # 32 are out, and its grant on record is 40, then less as they end.
    grant = next_grant(Limits(calls=64), holding("a", 100, granted=50, in_use=40),
                       [holding("b", 100, granted=14)])
    assert grant.use == {CALLS: 32} and grant.held == {CALLS: 40}


def test_a_lapsed_claim_gets_no_share_but_its_grant_counts_until_released() -> None:
    # c's lease lapsed with 16 granted: a alone is live and its share is all 64, but only the
    # 48 that c's grant leaves are free.
    grant = next_grant(Limits(calls=64), holding("a", 100, granted=32),
                       [holding("c", 100, granted=16, live=False)])
    assert grant.use == grant.held == {CALLS: 48}


def test_each_metered_dimension_is_granted_on_its_own() -> None:
    # 1,200 requests a minute: a asks for 300 (its rate with headroom), b for all of it.
    me = Holding("b", "b", "standard", 1.0, {CALLS: 10, REQUESTS: 1200}, {CALLS: 10, REQUESTS: 600})
    a = Holding("a", "a", "standard", 1.0, {CALLS: 10, REQUESTS: 300}, {CALLS: 10, REQUESTS: 300})
    assert next_grant(Limits(calls=20, requests=1200), me, [a]).use == {CALLS: 10, REQUESTS: 900}
