"""The canary judge (measure.canary) and its tests (measure.two_sample) against hand-computed
rank and proportion tests."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence

import pytest

from measure import canary, two_sample
from measure.canary import CanaryThresholds, Check, Verdict, VersionSample, judge
from measure.two_sample import mann_whitney, proportion_test


def sample(latencies: Sequence[float], *, overheads: Sequence[float] | None = None,
           costs: Sequence[float] | None = None, errors: int = 0, dead_lettered: int = 0,
           partitions: Mapping[int, tuple[int, int]] | None = None, ai_calls: int = 0,
           in_flight: int = 0) -> VersionSample:
    """A version whose every request completed, the i-th produced in second i (one per interval:
    the per-interval medians are the values); overheads a tenth of the latencies unless given."""
    timed = list(enumerate(latencies))
    return VersionSample([(float(i), v) for i, v in timed],
                         [(float(i), 0.1 * v if overheads is None else overheads[i]) for i, v in timed],
                         costs, len(latencies), errors, dead_lettered, partitions or {0: (1, 1)}, ai_calls,
                         in_flight)


def lognormal(seed: int, n: int, scale: float = 1.0, sigma: float = 0.5) -> list[float]:
    """n latencies of median 2 s x scale."""
    rng = random.Random(seed)
    return [scale * rng.lognormvariate(math.log(2.0), sigma) for _ in range(n)]


def outcome(verdict: canary.Verdict, name: str) -> str:
    return next(c.outcome for c in verdict.checks if c.name == name)


@pytest.mark.parametrize(("z", "tail"), [(1.96, 0.025), (1.645, 0.05), (2.326, 0.01), (3.09, 0.001),
                                         (0.0, 0.5), (-1.96, 0.975)])
def test_normal_upper_tail_matches_the_tables(z: float, tail: float) -> None:
    assert two_sample.normal_upper_tail(z) == pytest.approx(tail, abs=5e-5)  # z = 1.96: two-sided 0.05


def test_u_and_z_of_two_small_samples_with_ties() -> None:
    # baseline 1 2 3 3, candidate 3 4 5. Pooled ranks: 1, 2, then three 3s at ranks 3-5 (mid-rank
    # 4), 4 -> 6, 5 -> 7. The candidate's rank sum 4 + 6 + 7 = 17, U = 17 - 3 x 4 / 2 = 11 (by pairs:
    # 3 beats 1 and 2 and ties two 3s: 3; 4 and 5 beat all four: 11). Mean n1 n2 / 2 = 6.
    # Variance 12 / 12 x (7 + 1 - (3^3 - 3) / (7 x 6)) = 8 - 24/42 = 52/7 = 7.428571, sigma 2.725541.
    # z = (11 - 6 - 0.5) / 2.725541 = 1.651049; tables: P(Z > 1.65) = 0.04947, P(Z > 1.66) = 0.04846,
    # so p = 0.04936 one-sided, 0.0987 two-sided.
    test = mann_whitney([1.0, 2.0, 3.0, 3.0], [3.0, 4.0, 5.0])
    assert test.u == 11.0
    assert test.z == pytest.approx(1.651049, abs=1e-6)
    assert test.p_greater == pytest.approx(0.04936, abs=5e-5)
    assert test.p_two_sided == pytest.approx(0.0987, abs=1e-4)
    assert test.superiority == pytest.approx(11 / 12)
    # differences candidate - baseline: 2 1 0 0 / 3 2 1 1 / 4 3 2 2; sorted 0 0 1 1 1 2 2 2 2 3 3 4:
    # the 6th and 7th are both 2. Baseline median 2.5: relative shift 0.8.
    assert (test.shift, test.baseline_median, test.relative_shift) == (2.0, 2.5, pytest.approx(0.8))
    assert (test.shift_low, test.shift_high) == (None, None)  # 12 pairs give no 99% bound
    assert (test.n, test.observed) == ((4, 3), (4, 3))


def test_the_mirrored_samples_are_the_other_tail() -> None:
    # U of the baseline = 12 - 11 = 1; z = -(5 - 0.5) / sigma; one-sided toward "larger":
    # (1 - 6 - 0.5) / 2.725541 = -2.017946: P(Z > -2.018) = 1 - 0.02180 = 0.97820 (tables).
    test = mann_whitney([3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 3.0])
    assert test.u == 1.0
    assert test.z == pytest.approx(-1.651049, abs=1e-6)
    assert test.p_greater == pytest.approx(0.97820, abs=5e-5)
    assert test.p_two_sided == pytest.approx(0.0987, abs=1e-4)
    assert test.shift == -2.0


def test_shift_bounds_by_hand() -> None:
    # baseline 0..4, candidate 2..6: differences 2 + (j - i), so -2..6 with counts 1 2 3 4 5 4 3 2 1.
    # U: 2.5 + 3.5 + 4.5 + 5 + 5 = 20.5. Ties 2, 3, 4 twice each: sum(t^3 - t) = 18;
    # variance 25 / 12 x (11 - 18 / 90) = 22.5, sigma 4.743416; z = (20.5 - 12.5 - 0.5) / sigma = 1.581139.
    # Bounds at 95%: k = floor(12.5 - 1.644854 x 4.743416 + 0.5) = floor(5.198) = 5: the 5th smallest
    # difference is 0 (-2, -1, -1, 0, 0), the 21st (5th largest) is 4 (6, 5, 5, 4, 4).
    test = mann_whitney([0.0, 1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 5.0, 6.0], confidence=0.95)
    assert test.u == 20.5
    assert test.z == pytest.approx(1.581139, abs=1e-6)
    assert test.p_greater == pytest.approx(0.05693, abs=1e-4)  # tables: P(Z > 1.58) 0.05705, 1.59 0.05592
    assert (test.shift, test.shift_low, test.shift_high) == (2.0, 0.0, 4.0)
    assert (test.relative_shift, test.relative_low, test.relative_high) == (1.0, 0.0, 2.0)  # median 2


def test_identical_and_constant_samples_show_no_difference() -> None:
    same = mann_whitney([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert (same.u, same.z, same.p_two_sided, same.shift) == (4.5, 0.0, 1.0, 0.0)  # U = 9 / 2
    flat = mann_whitney([2.0] * 5, [2.0] * 7)
    assert (flat.z, flat.p_two_sided, flat.p_greater, flat.superiority) == (0.0, 1.0, 1.0, 0.5)
    zero = mann_whitney([0.0, 0.0, 0.0], [0.0, 1.0, 1.0])
    assert zero.shift == 1.0 and zero.relative_shift is None  # no relative shift over a median of 0


def test_the_shift_is_the_median_of_every_pairwise_difference() -> None:
    # by its definition, enumerating the pairs (the module selects without forming them)
    rng = random.Random(3)
    for _ in range(30):
        xs = [round(rng.uniform(0, 3), 1) for _ in range(rng.randint(1, 40))]
        ys = [round(rng.uniform(0, 3), 1) for _ in range(rng.randint(1, 40))]
        pairs = sorted(y - x for x in xs for y in ys)
        middle = len(pairs) // 2
        expected = pairs[middle] if len(pairs) % 2 else (pairs[middle - 1] + pairs[middle]) / 2
        assert mann_whitney(xs, ys).shift == pytest.approx(expected)


def test_thinning_keeps_the_count_under_the_cap_and_the_median() -> None:
    values = [float(v) for v in reversed(range(10_001))]  # median 5000
    thinned = two_sample.thin(values, cap=1001)
    assert len(thinned) == 1001
    assert thinned[500] == 5000.0 and (thinned[0], thinned[-1]) == (0.0, 10_000.0)  # every 10th
    assert thinned[:3] == [0.0, 10.0, 20.0]
    even = two_sample.thin([float(v) for v in range(10_000)], cap=1000)  # median 4999.5, stride 10.009
    assert len(even) == 1000 and abs((even[499] + even[500]) / 2 - 4999.5) <= 5.005
    assert two_sample.thin([3.0, 1.0, 2.0], cap=5) == [1.0, 2.0, 3.0]
    test = mann_whitney(values, values, cap=1001)
    assert (test.n, test.observed, test.baseline_median) == ((1001, 1001), (10_001, 10_001), 5000.0)


def test_proportions_by_hand() -> None:
    # 10 of 1000 against 25 of 1000: pooled 35 / 2000 = 0.0175,
    # se = sqrt(0.0175 x 0.9825 x 2 / 1000) = 0.00586409, z = 0.015 / se = 2.55794;
    # tables: P(Z > 2.55) = 0.00539, P(Z > 2.56) = 0.00523, so p = 0.00526.
    # Wald bounds at 99%: 0.015 -+ 2.326348 x sqrt(0.0099 / 1000 + 0.024375 / 1000) = 0.015 -+ 0.013620.
    test = proportion_test(10, 1000, 25, 1000)
    assert (test.baseline_rate, test.candidate_rate) == (0.01, 0.025)
    assert test.difference == pytest.approx(0.015)
    assert test.z == pytest.approx(2.55794, abs=1e-5)
    assert test.p_greater == pytest.approx(0.00526, abs=3e-5)
    assert (test.low, test.high) == (pytest.approx(0.001380, abs=1e-6), pytest.approx(0.028620, abs=1e-6))
    none = proportion_test(0, 500, 0, 500)
    assert (none.z, none.p_greater, none.difference) == (0.0, 1.0, 0.0)
    with pytest.raises(ValueError):
        proportion_test(3, 2, 0, 10)
    with pytest.raises(ValueError):
        proportion_test(0, 0, 0, 10)


@pytest.mark.parametrize("bad", [
    {"alpha": 0.0}, {"alpha": 0.5}, {"max_latency_increase": -0.1}, {"max_cost_increase": math.inf},
    {"max_added_error_rate": 1.0}, {"max_added_dead_letter_rate": -0.01}, {"min_keep_up": 0.0},
    {"min_keep_up": 1.1}, {"min_samples": 5}, {"min_intervals": 9}, {"interval_s": 0.0},
    {"interval_s": math.inf},
])
def test_thresholds_refuse_what_means_nothing(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CanaryThresholds(**bad)  # type: ignore[arg-type]


def test_identical_versions_pass() -> None:
    latencies = lognormal(1, 200)
    verdict = judge(sample(latencies, costs=[0.001] * 200, partitions={0: (200, 200)}),
                    sample(latencies, costs=[0.001] * 200, partitions={1: (200, 200)}))
    assert verdict.outcome == "pass"
    assert [c.name for c in verdict.checks] == ["latency", "overhead", "cost_per_request", "error_rate",
                                                "dead_letter_rate", "keep_up"]
    assert all(c.outcome == "pass" for c in verdict.checks)
    latency = verdict.checks[0]
    assert latency.effect == 0.0 and latency.measured == latency.baseline
    assert latency.p_value is not None and latency.p_value > 0.5  # U at its mean: corrected toward 0.5


def test_thirty_percent_slower_on_200_requests_fails() -> None:
    # 30 % on the latency (and so on the overhead, a tenth of it) over sigma 0.5 in log, paired
    # second by second. The paired shift estimates the pseudo-median of 1.3 Y - X (X, Y of median
    # 2): 0.315 of the median, by a simulation of 400,000 Walsh pairs apart from this code.
    verdict = judge(sample(lognormal(7, 200)), sample(lognormal(8, 200, scale=1.3), partitions={1: (1, 1)}))
    latency = verdict.checks[0]
    assert (latency.outcome, verdict.outcome) == ("fail", "fail")
    assert latency.p_value is not None and latency.p_value < 1e-6
    assert latency.interval is not None and latency.interval["low"] < 0.315 < latency.interval["high"]
    assert latency.interval["low"] > 0.1  # beyond the tolerance even at the bound
    assert "significantly worse" in verdict.summary()


def test_thirty_percent_slower_on_8_requests_is_not_enough_data() -> None:
    verdict = judge(sample(lognormal(7, 8)), sample(lognormal(8, 8, scale=1.3), partitions={1: (1, 1)}))
    assert outcome(verdict, "latency") == "marginal"
    assert verdict.checks[0].note == ("not enough data: 8 intervals both versions served "
                                      "(8 baseline, 8 candidate; < 10)")
    assert verdict.outcome == "marginal"


def test_interval_medians_by_hand() -> None:
    # seconds 0: 3, 1, 2 -> 2; 1: 5 -> 5; 3: 4, 6 -> 5 (second 2 has none); -1.5 is in second -2
    values = [(0.1, 3.0), (0.9, 1.0), (1.0, 5.0), (0.5, 2.0), (3.2, 4.0), (3.99, 6.0), (-1.5, 7.0)]
    assert list(canary.interval_medians(values, 1.0).items()) == [(-2, 7.0), (0, 2.0), (1, 5.0), (3, 5.0)]
    # [-2, 0) 7; [0, 2) 1 2 3 5; [2, 4) 4 6
    assert list(canary.interval_medians(values, 2.0).items()) == [(-1, 7.0), (0, 2.5), (1, 5.0)]
    with pytest.raises(ValueError):
        canary.interval_medians(values, 0.0)


def test_a_stall_shared_by_one_seconds_requests_counts_once() -> None:
    # 30 seconds of one 2 s request each on both sides, but in the candidate's first second a stall
    # held 50 requests, each answered in 4 s. Per second the candidate's medians are 4 once and 2
    # 29 times: the differences are 2 once and 0 29 times. The test ranks the one nonzero: W+ = 1
    # at its mean 1/2 plus the correction, sigma = sqrt(1 x 2 x 3 / 24) = 0.5, z = 0, p = 0.5; of
    # the 465 Walsh averages 435 are 0, so the shift is 0 and the check passes.
    baseline = VersionSample([(float(i), 2.0) for i in range(30)], [(float(i), 0.2) for i in range(30)],
                             None, 30, 0, 0, {0: (30, 30)}, 30)
    stalled = [(0.01 * k + 0.001, 4.0) for k in range(50)] + [(float(i), 2.0) for i in range(1, 30)]
    candidate = VersionSample(stalled, [(at, 0.1 * v) for at, v in stalled], None, 79, 0, 0,
                              {1: (79, 79)}, 79)
    latency = judge(baseline, candidate).checks[0]
    assert (latency.outcome, latency.effect, latency.measured, latency.baseline) == ("pass", 0.0, 4.0, 2.0)
    assert latency.test is not None
    assert (latency.test["n"], latency.test["nonzero"], latency.test["w"]) == (30, 1, 1.0)
    assert (latency.statistic, latency.p_value) == (0.0, 0.5)


def test_a_slowdown_both_versions_share_cancels_in_their_pairs() -> None:
    # The load swings: second i's requests take i s on the baseline (1..20, median 10.5), and the
    # candidate is 20 % slower in each: 1.2 i. Every difference 0.2 i is positive: W+ = 210 of
    # mean 105, sigma^2 = 20 x 21 x 41 / 24 = 717.5, z = (105 - 0.5) / 26.7862 = 3.9013, p below
    # 1e-4; the Walsh averages 0.1 (i + j) lie symmetric about 2.1, the shift, 20 % of 10.5.
    baseline = [float(i) for i in range(1, 21)]
    candidate = [1.2 * v for v in baseline]
    latency = judge(sample(baseline), sample(candidate, partitions={1: (1, 1)})).checks[0]
    assert latency.statistic == pytest.approx(3.9013, abs=1e-4)
    assert latency.p_value is not None and latency.p_value < 1e-4
    assert latency.effect == pytest.approx(0.2)
    assert latency.outcome == "fail"
    # the same values unpaired: the swing of the load spreads both far wider than the shift
    assert mann_whitney(baseline, candidate).p_greater > 0.1


def test_five_percent_slower_on_many_requests_passes_though_significant() -> None:
    verdict = judge(sample(lognormal(7, 1500, sigma=0.3)),
                    sample(lognormal(8, 1500, scale=1.05, sigma=0.3), partitions={1: (1, 1)}))
    latency = verdict.checks[0]
    assert latency.p_value is not None and latency.p_value < 0.01  # significant
    assert latency.effect is not None and 0.0 < latency.effect < 0.1  # within the 10 %
    assert (latency.outcome, latency.note) == ("pass", "significant but within the tolerance")


def test_a_shift_beyond_the_tolerance_without_significance_is_marginal() -> None:
    # baseline 20 s in each of 10 seconds; the candidate's differences 3 + (-10, -8, .., -2, 2, .., 10)
    # = -7 -5 -3 -1 1 5 7 9 11 13, symmetric about 3: the shift is 3, 15 % of the median 20.
    # |d| ranked: 1 1 -> 1.5 each, 3 -> 3, 5 5 -> 4.5, 7 7 -> 6.5, 9 -> 8, 11 -> 9, 13 -> 10;
    # W+ = 1.5 + 4.5 + 6.5 + 8 + 9 + 10 = 39.5, mean 27.5, sigma^2 = 96.25 - 3 x 6 / 48 = 95.875,
    # z = (39.5 - 27.5 - 0.5) / 9.79158 = 1.17448: p = 0.1201 (tables), not below 0.01.
    differences = [-7.0, -5.0, -3.0, -1.0, 1.0, 5.0, 7.0, 9.0, 11.0, 13.0]
    verdict = judge(sample([20.0] * 10), sample([20.0 + d for d in differences], partitions={1: (1, 1)}))
    latency = verdict.checks[0]
    assert latency.statistic == pytest.approx(1.17448, abs=1e-5)
    assert latency.p_value == pytest.approx(0.1201, abs=1e-4)
    assert latency.effect == pytest.approx(3 / 20)
    assert latency.outcome == "marginal" and latency.note == "beyond the tolerance but not significant"


def test_error_rates_judged_on_the_added_rate() -> None:
    ok = [1.0] * 975
    base, worse = sample([1.0] * 990, errors=10), sample(ok, errors=25, partitions={1: (1, 1)})
    check = next(c for c in judge(base, worse).checks if c.name == "error_rate")
    # 0.015 added, p = 0.0053 (test_proportions_by_hand): beyond 0.01 and significant
    assert (check.outcome, check.measured, check.baseline) == ("fail", 0.025, 0.01)
    assert check.effect == pytest.approx(0.015)
    assert outcome(judge(base, worse, CanaryThresholds(max_added_error_rate=0.02)), "error_rate") == "pass"
    # 1 of 100 against 4 of 100: pooled 0.025, se = sqrt(0.025 x 0.975 x 0.02) = 0.022079,
    # z = 0.03 / se = 1.3587, p = 0.087: 0.03 added is beyond 0.01 but not significant
    small = judge(sample([1.0] * 99, errors=1), sample([1.0] * 96, errors=4, partitions={1: (1, 1)}))
    assert outcome(small, "error_rate") == "marginal"
    assert outcome(judge(sample([1.0] * 20, dead_lettered=1), sample([1.0] * 20, partitions={1: (1, 1)})),
                   "dead_letter_rate") == "marginal"  # 21 and 20 outcomes: not enough data


def test_dead_letters_count_apart_from_errors() -> None:
    verdict = judge(sample([1.0] * 1000), sample([1.0] * 950, dead_lettered=50, partitions={1: (1, 1)}))
    # 0 against 0.05: pooled 0.025, se = sqrt(0.025 x 0.975 x 2 / 1000) = 0.006982, z = 7.16
    assert outcome(verdict, "dead_letter_rate") == "fail"
    assert outcome(verdict, "error_rate") == "pass"


def test_keep_up_allows_one_members_in_flight_records() -> None:
    parts = {1: (1000, 990), 2: (1000, 900), 3: (30, 22), 4: (0, 0), 5: (100, 140)}
    verdict = judge(sample([1.0] * 40), sample([1.0] * 40, partitions=parts, in_flight=20))
    check = next(c for c in verdict.checks if c.name == "keep_up")
    # partition 2: 0.9 < 0.95 and 100 behind > 20 in flight; 3: 0.73 but only 8 behind; 5 drained a backlog
    assert (check.outcome, check.note) == ("fail", "partitions behind: 2")
    assert (check.measured, check.statistic) == (pytest.approx(22 / 30), 100.0)
    del parts[2]
    kept = judge(sample([1.0] * 40), sample([1.0] * 40, partitions=parts, in_flight=20))
    assert outcome(kept, "keep_up") == "pass"
    no_allowance = judge(sample([1.0] * 40), sample([1.0] * 40, partitions={3: (30, 22)}))
    assert outcome(no_allowance, "keep_up") == "fail"


def test_cost_compares_when_both_versions_are_priced() -> None:
    cheap, dear = [0.001] * 100, [0.0015] * 100
    verdict = judge(sample([1.0] * 100, costs=cheap), sample([1.0] * 100, costs=dear, partitions={1: (1, 1)}))
    cost = next(c for c in verdict.checks if c.name == "cost_per_request")
    # every candidate cost above every baseline one: U = 100 x 100, z = 14.1; shift 0.0005, +50 %
    assert (cost.outcome, cost.measured, cost.baseline) == ("fail", 0.0015, 0.001)
    assert cost.effect == pytest.approx(0.5)
    unpriced = judge(sample([1.0] * 40), sample([1.0] * 40, partitions={1: (1, 1)}))
    assert outcome(unpriced, "cost_per_request") == "pass"
    one = judge(sample([1.0] * 40), sample([1.0] * 40, costs=[0.001] * 40, partitions={1: (1, 1)}))
    assert outcome(one, "cost_per_request") == "marginal"


def test_the_verdict_is_the_worst_check_and_serialises() -> None:
    # too few latencies (marginal) and a backlog (fail): fail
    verdict = judge(sample([1.0] * 8), sample([1.0] * 8, partitions={1: (100, 10)}))
    assert [c.outcome for c in verdict.checks].count("marginal") >= 1
    assert verdict.outcome == "fail"
    as_json = json.loads(json.dumps(verdict.to_dict(), allow_nan=False))
    assert as_json["outcome"] == "fail" and as_json["checks"][-1]["name"] == "keep_up"
    full = judge(sample(lognormal(1, 50)), sample(lognormal(2, 50), partitions={1: (1, 1)}))
    assert json.loads(json.dumps(full.to_dict(), allow_nan=False))["checks"][0]["test"]["n"] == 50


def test_quota_share_against_the_partition_share() -> None:
    base = sample([1.0] * 40, partitions={p: (1, 1) for p in range(6)}, ai_calls=600)
    cand = sample([1.0] * 40, partitions={6: (1, 1), 7: (1, 1)}, ai_calls=300)
    shares = judge(base, cand).quota_share
    # partitions 6 and 2 of 8: 0.75 and 0.25; calls 600 and 300 of 900: 2/3 and 1/3
    assert shares["baseline"] == {"partitions": 6, "partition_share": 0.75, "ai_calls": 600,
                                  "call_share": pytest.approx(2 / 3),
                                  "calls_over_partitions": pytest.approx(8 / 9)}
    assert shares["candidate"]["calls_over_partitions"] == pytest.approx(4 / 3)
    idle = judge(sample([1.0] * 40), sample([1.0] * 40, partitions={1: (1, 1)})).quota_share
    assert idle["candidate"]["call_share"] is None and idle["candidate"]["calls_over_partitions"] is None


def test_a_partition_in_both_versions_is_no_split() -> None:
    with pytest.raises(ValueError, match="splits by partitions"):
        judge(sample([1.0] * 40), sample([1.0] * 40))
    with pytest.raises(ValueError):
        sample([1.0], errors=-1)


def test_a_summary_gives_each_unpassed_check_its_figures_and_the_shift_s_bounds() -> None:
    latency = Check("latency", "marginal", 0.5, 0.4, "shift <= 10%", p_value=0.0312,
                    interval={"estimate": 0.25, "low": -0.05, "high": 0.5, "confidence": 0.98},
                    note="beyond the tolerance but not significant")
    keep_up = Check("keep_up", "pass", 1.0, 1.0, ">= 0.95")
    assert Verdict("marginal", (latency, keep_up)).summary() == (
        "MARGINAL: latency marginal (beyond the tolerance but not significant; 0.5 against 0.4; "
        "shift 0.25 [-0.05, 0.5], p 0.0312)")
    assert Verdict("pass", (keep_up,)).summary() == "PASS: keep_up pass (>= 0.95; 1 against 1)"
