"""The figures of a shared quota (measure.quota_share) on hand-computed inputs."""

from __future__ import annotations

import math

import pytest

from measure import quota_share

WEIGHTS = {"a": 2.0, "b": 1.0, "c": 1.0}  # 64 slots: a is due 64 * 2/4 = 32, b and c 16 each


def test_fair_shares_follow_the_weights() -> None:
    assert quota_share.fair_shares(64, WEIGHTS) == {"a": 32.0, "b": 16.0, "c": 16.0}


def test_use_in_proportion_to_the_weights_is_fair() -> None:
    used = {"a": 32.0, "b": 16.0, "c": 16.0}
    assert quota_share.share_of_fair(used, WEIGHTS, 64) == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert quota_share.weighted_jain(used, WEIGHTS) == 1.0  # x = 32/2, 16, 16: all equal
    assert quota_share.jain_index(used.values()) == pytest.approx(64 ** 2 / (3 * 1536))  # 8/9: unweighted
    assert quota_share.quota_used(sum(used.values()), 64) == 1.0


def test_a_pipeline_taking_more_than_its_share() -> None:
    used = {"a": 40.0, "b": 12.0, "c": 12.0}
    # share of fair: 40/32 = 1.25, 12/16 = 0.75 twice
    assert quota_share.share_of_fair(used, WEIGHTS, 64) == {"a": 1.25, "b": 0.75, "c": 0.75}
    # x = 40/2, 12/1, 12/1 = 20, 12, 12: sum 44, squares 400 + 144 + 144 = 688;
    # 44^2 / (3 * 688) = 1936 / 2064 = 121/129 = 0.938
    assert quota_share.weighted_jain(used, WEIGHTS) == pytest.approx(121 / 129)
    # the same over the shares of fair (the index is blind to scale): 2.75^2 / (3 * 2.6875) = 121/129
    shares = quota_share.share_of_fair(used, WEIGHTS, 64)
    assert quota_share.jain_index(shares.values()) == pytest.approx(121 / 129)


def test_jain_index_from_equal_to_one_holding_everything() -> None:
    assert quota_share.jain_index([5.0, 5.0, 5.0, 5.0]) == 1.0
    assert quota_share.jain_index([9.0, 0.0, 0.0]) == pytest.approx(1 / 3)  # 81 / (3 * 81)
    assert quota_share.jain_index([3.0, 1.0]) == pytest.approx(0.8)  # 16 / (2 * 10)
    assert quota_share.jain_index([]) is None
    assert quota_share.jain_index([0.0, 0.0]) is None
    assert quota_share.weighted_jain({}, WEIGHTS) is None  # nothing used


def test_what_an_idle_pipeline_leaves_goes_to_the_others_by_weight() -> None:
    # b demands 4 of its 16: 60 are left for a and c, 2:1, so 40 and 20
    assert quota_share.fair_allocation(64, WEIGHTS, {"b": 4.0}) == {"a": 40.0, "b": 4.0, "c": 20.0}
    used = {"a": 40.0, "b": 4.0, "c": 20.0}
    assert quota_share.share_of_fair(used, WEIGHTS, 64, {"b": 4.0}) == {"a": 1.0, "b": 1.0, "c": 1.0}
    # without the demands, b's 4 of 16 reads as starved, and a and c as taking more than due
    assert quota_share.share_of_fair(used, WEIGHTS, 64) == {"a": 1.25, "b": 0.25, "c": 1.25}
    # an idle pipeline is due nothing: it has no ratio, and the others share all 64 by weight
    assert quota_share.share_of_fair({"a": 128 / 3, "c": 64 / 3}, WEIGHTS, 64, {"b": 0.0}) == {
        "a": pytest.approx(1.0), "c": pytest.approx(1.0)}


def test_water_filling_serves_in_rounds() -> None:
    weights = dict.fromkeys("abc", 1.0)
    # round 1: 20 each, a (10) served, 50 left; round 2: 25 each, b (22) served, 28 left; c takes them
    assert quota_share.fair_allocation(60, weights, {"a": 10.0, "b": 22.0}) == {
        "a": 10.0, "b": 22.0, "c": 28.0}
    # nobody demands a share: each gets its demand, 30 of 60 stay unallocated
    assert quota_share.fair_allocation(60, weights, dict.fromkeys("abc", 10.0)) == dict.fromkeys("abc", 10.0)
    # every one backlogged: the fair shares
    assert quota_share.fair_allocation(64, WEIGHTS, {"a": math.inf}) == quota_share.fair_shares(64, WEIGHTS)


def test_quota_used_and_what_is_refused() -> None:
    assert quota_share.quota_used(48, 64) == 0.75
    with pytest.raises(ValueError):
        quota_share.quota_used(1, 0)
    with pytest.raises(ValueError):
        quota_share.fair_shares(64, {"a": 1.0, "b": 0.0})
    with pytest.raises(ValueError):
        quota_share.fair_allocation(64, {}, {})
