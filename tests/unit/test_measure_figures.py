"""The figure definitions (measure.figures) on hand-built inputs."""

from __future__ import annotations

import math

import pytest

from measure import capacity, figures
from measure.capacity import BandWork


def waves(slots: int, period_s: float, count: int, spread_s: float = 0.05) -> list[float]:
    """`count` waves: `slots` calls that started together finishing within `spread_s`."""
    return [k * period_s + spread_s * j / slots for k in range(count) for j in range(slots)]


@pytest.mark.parametrize("offset", [0.0, 0.7, 1.9])
def test_steady_rate_of_waves_is_slots_over_period(offset: float) -> None:
    times = [t + offset for t in waves(64, 3.0, 20)]
    assert figures.steady_rate(times) == pytest.approx(64 / 3.0, rel=0.02)


def test_steady_rate_ignores_ramp_and_tail() -> None:
    ramp = [i * 1.0 for i in range(10)]  # 1/s
    plateau = [10 + i * 0.05 for i in range(400)]  # 20/s
    tail = [30 + i * 2.0 for i in range(10)]  # 0.5/s
    assert figures.steady_rate(ramp + plateau + tail) == pytest.approx(20.0, rel=0.01)


def test_steady_rate_is_the_slope_between_the_20th_and_80th_percentile_completion() -> None:
    # 11 completions: ranks 2..8 are the band, at 1 s steps from t = 2: exactly 1/s whatever the ends
    times = [0.0, 0.1, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 50.0, 90.0]
    assert figures.steady_rate(times) == pytest.approx(1.0)
    assert figures.steady_rate(times[:9]) == 0.0  # fewer than 10 points
    assert figures.steady_rate([5.0] * 12) == 0.0  # no time passed on the plateau


def test_percentile_interpolates_linearly_between_closest_ranks() -> None:
    # rank (n - 1) * q: 1.5 -> 2.5, 2.85 -> 3.85, 2.97 -> 3.97 (PostgreSQL percentile_cont)
    values = [4.0, 1.0, 3.0, 2.0]
    assert [figures.percentile(values, q) for q in figures.QUANTILES] == [
        pytest.approx(2.5), pytest.approx(3.85), pytest.approx(3.97)]
    assert figures.percentile([7.0], 0.99) == 7.0
    assert figures.percentile([], 0.5) is None


def test_settled_and_lost_count_the_terminal_statuses_only() -> None:
    statuses = {"completed": 6, "rejected": 1, "dead_lettered": 1, "checking": 1, "generating": 1}
    assert figures.settled(statuses) == 8
    assert figures.lost(10, statuses) == 2  # the two still in flight count as lost
    assert figures.lost(8, {}) == 8


def test_span_and_throughput() -> None:
    assert figures.span_s(100.0, 120.0) == 20.0
    assert figures.throughput_rps(50, 20.0) == 2.5
    assert figures.span_s(None, 120.0) is None
    assert figures.throughput_rps(50, None) == 0.0
    assert figures.throughput_rps(50, 0.0) == 0.0


def test_goodput_counts_the_requests_within_the_objective_per_second_of_the_span() -> None:
    # 80 of 100 completed requests within 2.5 s, over a 20 s span: 0.8 of them, 4 good ones a second
    assert figures.objective_figures(2.5, 0.99, 100, 80, 20.0) == {
        "objective_s": 2.5, "objective_share": 0.99, "within_objective": 80,
        "share_within_objective": 0.8, "goodput_rps": 4.0}
    assert figures.objective_figures(2.5, 0.99, 3, 2, 7.0)["share_within_objective"] == 0.6667  # 2/3
    nothing = figures.objective_figures(2.5, 0.99, 0, 0, None)
    assert (nothing["share_within_objective"], nothing["goodput_rps"]) == (None, 0.0)
    with pytest.raises(ValueError):
        figures.objective_figures(2.5, 0.99, 10, 11, 5.0)


def test_duplicate_calls_are_calls_beyond_the_first_per_pair() -> None:
    assert figures.beyond_first([1, 3, 2, 1]) == 3
    assert figures.beyond_first([]) == 0


def test_skew_of_even_hot_and_empty_partitions() -> None:
    assert figures.skew([5, 5, 5, 5]) == (1.0, 0.0)
    max_over_mean, cv = figures.skew([20, 0, 0, 0])  # mean 5, population variance 75
    assert (max_over_mean, cv) == (4.0, pytest.approx(math.sqrt(75) / 5))
    assert figures.skew([0, 0]) == (None, None)
    assert figures.skew([]) == (None, None)


def test_gini_and_hottest_share_against_hand_computed_values() -> None:
    ramp = [20, 0, 40, 10, 30]  # loads 0..40 step 10
    assert figures.gini(ramp) == pytest.approx(0.4)  # sum |xi - xj| over all pairs = 400; 400 / (2 * 25 * 20)
    assert figures.hottest(ramp) == (2, pytest.approx(0.4))
    assert figures.gini([5, 5, 5]) == pytest.approx(0.0)
    assert figures.hottest([5, 5, 5]) == (0, pytest.approx(1 / 3))  # a tie goes to the lowest
    assert figures.gini([0, 0, 12, 0]) == pytest.approx(0.75)  # everything on one of four: (n - 1) / n
    assert figures.hottest([0, 0, 12, 0]) == (2, 1.0)
    assert (figures.gini([0, 0]), figures.hottest([0, 0])) == (None, (None, None))


def test_hot_partitions_are_strictly_above_threshold_times_the_mean() -> None:
    ramp = [0, 10, 20, 30, 40]  # mean 20
    assert figures.hot_partitions(ramp, 2.0) == []  # 40 is not > 2 x 20
    assert figures.hot_partitions(ramp, 1.5) == [4]
    assert figures.hot_partitions([100, 1], 1.5) == [0]  # 100 > 1.5 x 50.5
    assert figures.hot_partitions([0, 0], 2.0) == []


def test_consumer_lag_counts_from_the_low_watermark_when_nothing_was_committed() -> None:
    assert figures.consumer_lag(low=10, high=50, committed=45) == 5
    assert figures.consumer_lag(low=10, high=50, committed=-1001) == 40  # OFFSET_INVALID


def test_lag_trend_is_the_least_squares_slope() -> None:
    assert figures.lag_trend([(0.0, 10), (1.0, 12), (2.0, 14), (3.0, 16)]) == pytest.approx(2.0)
    # lag 0, 4, 0, 4: slope of (0,0) (1,4) (2,0) (3,4) = sum((t - 1.5)(y - 2)) / sum((t - 1.5)^2) = 4 / 5
    assert figures.lag_trend([(0.0, 0), (1.0, 4), (2.0, 0), (3.0, 4)]) == pytest.approx(0.8)
    assert figures.lag_trend([(5.0, 3)]) == 0.0
    assert figures.lag_trend([]) == 0.0


def test_hashing_skew_bound_is_the_union_bound_on_the_binomial_tail() -> None:
    # 4 records, 2 partitions: P(X >= 4) = 1/16, P(X >= 3) = 5/16; x2 partitions: 1/8 <= 0.2 < 5/8.
    # So c = 4 over a mean of 2.
    assert figures.hashing_skew_bound(4, 2, alpha=0.2) == 2.0
    # 6 records, 3 partitions: P(X >= 5) = 13/729 (x3 = 0.054 <= 0.1), P(X >= 4) = 73/729 (x3 = 0.30).
    assert figures.hashing_skew_bound(6, 3, alpha=0.1) == 2.5
    assert figures.hashing_skew_bound(10, 1) == 1.0  # one partition: nothing to skew


def test_the_hashing_bound_separates_small_samples_from_a_sticky_partitioner() -> None:
    # 160 UUID-keyed requests over 16 partitions reach a max/mean of 2.1 by chance (seen in a run);
    # a keyless burst of 1280 on 64 partitions reached 26.4, far beyond what hashing explains.
    assert figures.hashing_skew_bound(160, 16) > 2.1
    assert figures.hashing_skew_bound(1280, 64) < 3
    assert figures.hashing_skew_bound(100_000, 64) < 1.15  # large samples: the bound closes in on 1


def test_steady_band_runs_from_the_20th_to_the_80th_percentile_completion() -> None:
    # 11 completions: ranks 2 and 8 bound the band
    times = [0.0, 0.1, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 50.0, 90.0]
    assert figures.steady_band(list(reversed(times))) == (2.0, 8.0)
    assert figures.steady_band(times[:9]) is None


def test_run_figures_assembles_every_figure() -> None:
    got = figures.run_figures(
        produced=15, status={"completed": 12, "rejected": 1, "checking": 1}, span=2.0,
        steady_throughput_rps=10.0, service_s={"generate": 0.2, "check": 0.02}, ai_limit=4,
        ok_calls={"check": 15, "generate": 12}, band=(1.0, 3.0),
        band_work={"generate": BandWork(busy_s=6.0, started=30), "check": BandWork(busy_s=1.0, started=40)},
        duplicate_ai_calls=1, skew_max_over_mean=1.25, skew_cv=0.2,
        latency_s={0.5: 0.5, 0.95: 0.95, 0.99: None}, skew_records=4, skew_partitions=2)
    assert got == {
        "produced": 15, "completed": 12, "status": {"completed": 12, "rejected": 1, "checking": 1},
        "lost": 2,  # 15 produced, 13 settled
        "span_s": 2.0, "throughput_rps": 6.0,  # 12 / 2 s
        "steady_throughput_rps": 10.0,
        "service_s": {"check": 0.02, "generate": 0.2},
        "calls_per_request": {"check": 1.25, "generate": 1.0},  # 15 and 12 calls for 12 completed
        "ai_limit": 4,
        # check: 4 / (0.02 s x 1.25) = 160 rps; generate: 4 / (0.2 s x 1) = 20 rps
        "bottleneck_stage": "generate", "binding_limit": "generate.concurrency", "capacity_rps": 20.0,
        "capacity_candidates": {"check.concurrency": 160.0, "generate.concurrency": 20.0},
        "utilization": 0.75,  # generate's 6 call-seconds in the 2 s band / (4 slots x 2 s)
        "duplicate_ai_calls": 1, "skew_max_over_mean": 1.25, "skew_cv": 0.2,
        "skew_hashing_bound": 2.0,  # 4 records over 2 partitions: all 4 on one happens 1 in 8 times
        "p50_ms": 500.0, "p95_ms": 950.0, "p99_ms": None,
    }


def test_run_figures_without_successful_calls_has_no_capacity() -> None:
    got = figures.run_figures(produced=3, status={}, span=None, steady_throughput_rps=0.0, service_s={},
                              ai_limit=4, ok_calls={}, band_work={}, band=None, duplicate_ai_calls=0,
                              skew_max_over_mean=None, skew_cv=None, latency_s={})
    assert (got["lost"], got["throughput_rps"]) == (3, 0.0)
    assert (got["capacity_rps"], got["utilization"], got["binding_limit"]) == (None, None, None)
    assert got["p99_ms"] is None and got["bottleneck_stage"] is None


# 10 rps for 20 s, 5 rps for 20 s, then 10 rps again.
HALVED = [(0.0, 10.0), (20.0, 5.0), (40.0, 10.0)]


def test_servable_adds_the_capacity_in_force_piece_by_piece() -> None:
    assert figures.servable(HALVED, 10.0, 30.0) == 10 * 10 + 10 * 5
    assert figures.servable(HALVED, 35.0, 50.0) == 5 * 5 + 10 * 10
    assert figures.servable([(0.0, 4.0)], 1.0, 3.0) == 8


def test_physical_minimum_is_the_requests_at_the_capacity_in_force_plus_the_calls_around() -> None:
    # The reference burst: 1280 requests through generate's 64 slots of 3 s calls are 20 waves,
    # 60 s, in which every generate call is already counted; only check's 0.5 s before the first
    # of them adds to it, and nothing comes after generate's call: 60.5 s, not 60 + 3.5.
    assert figures.physical_minimum_s(1280, [(0.0, 64 / 3)], 0.5, 0.0) == pytest.approx(60.5)
    # 200 in the first 20 s, 100 in the next 20, the last 50 at 10 rps: 45 s, + 1 s of calls after.
    assert figures.physical_minimum_s(350, HALVED, 0.0, 1.0) == pytest.approx(46.0)
    assert figures.physical_minimum_s(150, HALVED) == pytest.approx(15.0)
    # The limit's first call comes 5 s in: 5 -> 20 s serves 150, 20 -> 40 s 100, the last 100 at
    # 10 rps take 10 s more: 50 s, + 1 s after.
    assert figures.physical_minimum_s(350, HALVED, 5.0, 1.0) == pytest.approx(51.0)
    assert figures.span_over_minimum(47.5, 46.0) == pytest.approx(1.0326, abs=1e-4)


def test_a_budgets_initial_allowance_passes_at_once() -> None:
    # 1000 calls through a bucket of 600 refilled at 40 a second (600 a minute at time scale
    # 0.25: a minute of 15 s): 600 at once, the other 400 take 10 s; 0.4 s after the last admission
    # (its own call) and 0.1 s before the first: 10.5 s. Without the allowance: 25 s.
    assert figures.physical_minimum_s(1000, [(0.0, 40.0)], 0.1, 0.4, allowance=600) == pytest.approx(10.5)
    # fewer calls than the bucket holds: only the calls around
    assert figures.physical_minimum_s(500, [(0.0, 40.0)], 0.1, 0.4, allowance=600) == pytest.approx(0.5)


# genai_image's reference burst at real scale: check (0.5 s) then generate (3 s), 64 slots each.
REFERENCE = capacity.Limits({"check": capacity.EndpointLimits(64), "generate": capacity.EndpointLimits(64)},
                            {"check": "check", "generate": "generate"})
REFERENCE_CHAINS = {"check": (0.0, 3.0), "generate": (0.5, 0.0)}  # AI seconds before and after each call


def test_the_physical_minimum_is_the_longest_over_the_limits() -> None:
    got = figures.physical_minimum(1280, REFERENCE, {"check": 0.5, "generate": 3.0},
                                   {"check": 1.0, "generate": 1.0}, REFERENCE_CHAINS)
    # check: 64 / 0.5 s = 128 rps, 1280 in 10 s, + 3 s of generate after: 13 s;
    # generate: 0.5 s of check before, + 1280 at 64 / 3 s = 21.33 rps, 60 s: 60.5 s.
    assert got == (pytest.approx(60.5), "generate.concurrency")
    # generate's 64 slots cut to 32 from 30 s: 640 requests by 30.5 s, the other 640 at
    # 32 / 3 s = 10.67 rps take 60 s: 90.5 s.
    got = figures.physical_minimum(1280, REFERENCE, {"check": 0.5, "generate": 3.0},
                                   {"check": 1.0, "generate": 1.0}, REFERENCE_CHAINS,
                                   "generate", [(0.0, 64), (30.5, 32)])
    assert got == (pytest.approx(90.5), "generate.concurrency")


def test_a_budget_that_binds_gives_the_minimum_with_its_allowance_and_its_own_call() -> None:
    # One stage `draft` on an endpoint of 64 slots, 0.4 s calls, 600 requests a minute at time scale
    # 0.25 (a 15 s minute: 40 calls/s, a bucket of 600 full at the start); 0.1 s of AI calls before.
    limits = capacity.Limits({"draft": capacity.EndpointLimits(64, requests_per_minute=600)},
                             {"draft": "draft"}, time_scale=0.25)
    got = figures.physical_minimum(3000, limits, {"draft": 0.4}, {"draft": 1.0}, {"draft": (0.1, 0.0)})
    # concurrency: 3000 / (64 / 0.4 s = 160 rps) = 18.75 s, + 0.1 s: 18.85 s;
    # budget: 0.1 s, 600 at once, 2400 at 40/s = 60 s, then the last call's 0.4 s: 60.5 s.
    assert got == (pytest.approx(60.5), "draft.requests_per_minute")
    # tokens: 60,000 a minute at time scale 1 with 250 tokens a call: 1000 tokens/s = 4 calls/s,
    # a bucket of 240 calls; 1000 calls: 760 / 4 = 190 s, + 0.1 before and 0.4 s of the last call
    tokens = capacity.Limits({"draft": capacity.EndpointLimits(64, tokens_per_minute=60_000)},
                             {"draft": "draft"}, tokens_per_call={"draft": 250.0})
    got = figures.physical_minimum(1000, tokens, {"draft": 0.4}, {"draft": 1.0}, {"draft": (0.1, 0.0)})
    assert got == (pytest.approx(190.5), "draft.tokens_per_minute")
    # fixed windows of a clock minute (a gateway's) at time scale 0.25: 600 a clock minute is
    # 150 a run's minute (15 s): 10 calls/s; two periods' 1200 may pass at once. 3000 calls:
    # 1800 / 10 = 180 s, + 0.5 s.
    windows = capacity.Limits({"draft": capacity.fixed_periods(
                                  capacity.EndpointLimits(64, requests_per_minute=150), 0.25)},
                              {"draft": "draft"}, time_scale=0.25)
    got = figures.physical_minimum(3000, windows, {"draft": 0.4}, {"draft": 1.0}, {"draft": (0.1, 0.0)})
    assert got == (pytest.approx(180.5), "draft.requests_per_minute")
    assert figures.physical_minimum(3000, limits, {}, {}, {}) is None  # nothing measured


def test_utilization_in_force_is_the_share_of_the_slots_in_force_that_calls_kept_busy() -> None:
    # HALVED read as 10, 5 then 10 slots; calls of 1 s, five at a time back to back from 0 to
    # 60 s: completions come five at once at 1, 2, ... 60 s. The band runs from the 60th (13 s) to
    # the 240th (48 s): 5 x 35 = 175 busy slot-seconds where the schedule gives 10 x 7 + 5 x 20 +
    # 10 x 8 = 250.
    calls = [(float(k), k + 1.0) for k in range(60) for _ in range(5)]
    times = [end for _, end in calls]
    assert figures.utilization_in_force(times, calls, HALVED) == pytest.approx(0.7)
    assert figures.utilization_in_force(times[:5], calls, HALVED) is None


def test_utilization_in_force_does_not_move_with_where_the_band_meets_a_wave() -> None:
    # Four slots of 2 s calls, all four busy from 0 to 80 s: a full service is 1.0
    # wherever the band's ends fall. Counting completions instead, the 32nd to the 127th (18 s
    # to 64 s: 95 completions where 2 calls/s x 46 s = 92 could be) made it 1.033.
    calls = [(float(k), k + 2.0) for k in range(0, 80, 2) for _ in range(4)]
    times = [end for _, end in calls]
    assert figures.utilization_in_force(times, calls, [(0.0, 4.0)]) == pytest.approx(1.0)


def test_recovery_is_when_the_last_window_of_completions_reaches_90_percent_of_the_new_capacity() -> None:
    # 5 rps until 40 s, then completions every 0.1 s from 42 s on (10 rps); window 1 s: the
    # window ending at t holds the completions in (t - 1, t], 9 of them first at 42.8 s.
    times = [i * 0.2 for i in range(200)] + [42 + i * 0.1 for i in range(50)]
    assert figures.recovery_s(times, 40.0, 10.0, 1.0) == pytest.approx(2.8)
    assert figures.recovery_s(times[:200], 40.0, 10.0, 1.0) is None


def test_overload_share() -> None:
    assert figures.overload_share(3, 300) == 0.01
    assert figures.overload_share(0, 0) is None


def test_utilization_in_force_counts_no_more_calls_at_once_than_the_slots_in_force() -> None:
    # Two slots; the caller times each call 0.1 s longer than the service held it (its way
    # there and back), so three calls overlap from 1.0 to 1.1, 2.0 to 2.1, ...: each 1.1 s,
    # two at a time, back to back. Summed plainly, 2 x 1.1 s every second of 2 slot-seconds:
    # 1.1. At most two at once: 1.0.
    calls = [(float(k), k + 1.1) for k in range(40) for _ in range(2)]
    times = [end for _, end in calls]
    assert figures.utilization_in_force(times, calls, [(0.0, 2.0)]) == pytest.approx(1.0)
