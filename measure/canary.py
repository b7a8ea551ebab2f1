"""The canary judge: does a candidate version of a pipeline's consumers do worse than the active
one over the same minutes of the same traffic?

A canary splits a topic by partitions: the candidate's members consume some, the baseline's
(the active version's) the rest, side by side. After each step's analysis window the judge
compares the two versions metric by metric, as Kayenta's NetflixACAJudge does: a Mann-Whitney U
test per distribution, classified pass / marginal / fail, the verdict the worst of the checks.

- times as series (`interval_medians`): latency and overhead are judged on each version's
  median per interval of production time, not per request. Requests one process handles in
  the same second share that second's stalls (a pause of the process, a slow batch of commits),
  so they are not independent, and a test that counts them as such overstates its evidence the
  fewer processes a side has: a canary's first step is one member holding one partition. The
  intervals' medians are about as independent as the stalls are short, which is what Kayenta
  judges too (a metric's time series over the same minutes). The cost per request stays per
  request: what a request's tokens cost does not depend on when it ran.

- rank test (`mann_whitney`): U of the candidate (pairs where the candidate's value is the
  larger, ties counted half), its z under the normal approximation with the tie-corrected
  variance and a continuity correction, the one-sided p-value for "candidate larger" (for
  latency, overhead and cost: worse) and the two-sided one. Effect sizes: the probability of
  superiority U / (n1 n2) = P(candidate > baseline) + P(tie) / 2, and the Hodges-Lehmann shift
  (the median of every candidate - baseline difference) over the baseline's median, with the
  distribution-free (Moses) bounds of the shift from the same normal approximation. Ranks
  rather than means: latencies are heavy-tailed, and a few slow calls move a mean and a
  t-test's variance far more than they move which version is typically faster.
- rate test (`proportion_test`): the pooled two-proportion z-test, one-sided "candidate's rate
  higher", for the error and dead-letter rates; with Wald bounds of the difference.
- classification of a "lower is better" metric: fail when the candidate is significantly worse
  (one-sided p < alpha) and its shift (relative for the distributions, absolute for the rates)
  is beyond the tolerance; marginal when the shift is beyond the tolerance without being
  significant, or when either version has fewer values than it takes (`min_intervals`,
  `min_samples`); pass otherwise. A
  significant but small shift passes: with thousands of requests a 2 % difference is
  significant, and the tolerance says what is worth holding a release for.
- keep-up: each candidate partition's completions over its arrivals in the window (see
  `_keep_up`): splitting by partitions only works if every partition is drained.
- quota share (reported, not judged): each version's share of the AI calls against its share of
  the partitions, since both versions spend the same provider quota.

Bounds are one-sided at 1 - alpha, as in measure.confidence: [low, high] is the two-sided
interval at 1 - 2 alpha. Plain Python like measure.confidence: no SciPy here.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Outcome = Literal["pass", "marginal", "fail"]
PASS: Outcome = "pass"
MARGINAL: Outcome = "marginal"
FAIL: Outcome = "fail"
_SEVERITY: dict[Outcome, int] = {PASS: 0, MARGINAL: 1, FAIL: 2}
Shares = dict[str, dict[str, float | int | None]]  # version -> its figures of the shared quota
Timed = tuple[float, float]  # (when its request was produced, epoch seconds; the value)

# Values kept per sample: the rank test sorts n1 + n2 values and the shift selects among n1 x n2
# differences in passes over n1 + n2 rather than sorting every pair. With thousands per side a
# shift of a few percent is already significant, so thinning costs the test no decision that
# matters.
MAX_SAMPLE = 5000
# Against U's exact distribution (no ties), the continuity-corrected normal approximation is off
# by at most 0.0043 in p at 10 values per side and 0.0014 at 30; near p = 0.01 it overstates p by
# some 14 % at 10 and 4 % at 30, on the conservative side. Below 10 only the exact test serves.
MIN_SAMPLES_FLOOR = 10


def normal_upper_tail(z: float) -> float:
    """P(Z > z) for the standard normal, accurate far into the tail (erfc, not 1 - cdf)."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def thin(values: Sequence[float], cap: int = MAX_SAMPLE) -> list[float]:
    """The values sorted, and above `cap` of them `cap` at evenly spaced ranks (every k-th, k
    fractional, the first and last included): each quantile stays within half a stride of the
    original's, and with an odd count and an odd cap the median is kept exactly. Deterministic,
    unlike a random subsample, so a verdict can be recomputed."""
    if cap < 2:
        raise ValueError("a thinned sample keeps at least 2 values")
    ordered = sorted(values)
    n = len(ordered)
    if n <= cap:
        return ordered
    stride = 2 * (cap - 1)  # rank i * (n - 1) / (cap - 1), rounded half up, in integers
    return [ordered[(2 * i * (n - 1) + cap - 1) // stride] for i in range(cap)]


def interval_medians(values: Sequence[Timed], interval_s: float) -> list[float]:
    """The median of the values produced in each interval of `interval_s` seconds (intervals
    counted from the epoch, so both versions' line up), in time order; intervals without a value
    give none."""
    if not interval_s > 0:
        raise ValueError("an interval is a positive number of seconds")
    grouped: dict[int, list[float]] = {}
    for at, value in values:
        grouped.setdefault(math.floor(at / interval_s), []).append(value)
    return [statistics.median(grouped[k]) for k in sorted(grouped)]


@dataclass(frozen=True)
class RankTest:
    """Mann-Whitney U of the candidate against the baseline (see the module docstring); `n` the
    values used per side (baseline, candidate), `observed` before thinning. `relative_*` is None
    when the baseline's median is 0; a bound None when the samples are too small to give one."""

    u: float
    z: float
    p_two_sided: float
    p_greater: float
    superiority: float
    shift: float
    shift_low: float | None
    shift_high: float | None
    baseline_median: float
    relative_shift: float | None
    relative_low: float | None
    relative_high: float | None
    confidence: float
    n: tuple[int, int]
    observed: tuple[int, int]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "n": list(self.n), "observed": list(self.observed)}


def _rank_sum(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, int]:
    """The candidate's (ys') rank sum in the pooled sample, tied values at their mid-rank, and
    the tie term sum(t^3 - t) over the groups of tied values."""
    pooled = sorted([(v, 0) for v in xs] + [(v, 1) for v in ys])
    ranks, ties, i = 0.0, 0, 0
    while i < len(pooled):
        j = i
        while j < len(pooled) and pooled[j][0] == pooled[i][0]:
            j += 1
        ranks += sum(side for _, side in pooled[i:j]) * (i + 1 + j) / 2  # ranks i + 1 .. j
        ties += (j - i) ** 3 - (j - i)
        i = j
    return ranks, ties


def _prefix_counts(ys: Sequence[float], rows: Sequence[float], pivot: float, strict: bool) -> list[int]:
    """Per candidate value y (ascending), how many of the differences y - rows[i] (rows
    descending, so they ascend with i) are below `pivot` (or at most it): a prefix of each row,
    shorter for larger y, so one pointer walks all rows."""
    counts, i = [], len(rows)
    for y in ys:
        while i > 0 and not (y - rows[i - 1] < pivot if strict else y - rows[i - 1] <= pivot):
            i -= 1
        counts.append(i)
    return counts


def _kth_difference(xs: Sequence[float], ys: Sequence[float], k: int) -> float:
    """The k-th smallest (from 1) of the len(xs) x len(ys) differences y - x, without forming
    them: selection in the implicitly sorted matrix (Monahan's algorithm for the Hodges-Lehmann
    estimator), a random candidate as pivot, rows kept as index ranges, until few enough remain
    to sort. `xs` and `ys` sorted ascending. The pivot's generator is seeded: same answer,
    same work, every time."""
    rows = list(reversed(xs))
    low, high = [0] * len(ys), [len(rows)] * len(ys)  # row j's candidates: rows[low[j]:high[j]]
    pick = random.Random(0)
    while True:
        left = sum(h - lo for lo, h in zip(low, high, strict=True))
        if left <= len(xs) + len(ys):
            rest = sorted(y - rows[i] for y, lo, h in zip(ys, low, high, strict=True) for i in range(lo, h))
            return rest[k - sum(low) - 1]
        at = pick.randrange(left)
        for y, lo, h in zip(ys, low, high, strict=True):
            if at < h - lo:
                pivot = y - rows[lo + at]
                break
            at -= h - lo
        below = _prefix_counts(ys, rows, pivot, strict=True)
        if sum(below) >= k:
            high = below
            continue
        upto = _prefix_counts(ys, rows, pivot, strict=False)
        if sum(upto) >= k:
            return pivot
        low = upto


def mann_whitney(baseline: Sequence[float], candidate: Sequence[float], confidence: float = 0.99,
                 cap: int = MAX_SAMPLE) -> RankTest:
    """The rank test of the candidate against the baseline, each thinned to `cap` values.

    z = (U - n1 n2 / 2 -+ 1/2) / sigma, sigma^2 = n1 n2 / 12 x (N + 1 - sum(t^3 - t) / (N (N - 1))),
    the correction of 1/2 toward 0 (0 when |U - n1 n2 / 2| <= 1/2); the one-sided p takes it
    toward the alternative. The normal approximation holds from about 10 values per side
    (MIN_SAMPLES_FLOOR, where its error is measured); below it p is rough. The shift's
    bounds are the k-th smallest and largest differences, k = round(n1 n2 / 2 - z_c sigma), the
    values of the shift the one-sided test at `confidence` would not reject.
    """
    if not baseline or not candidate:
        raise ValueError("a rank test needs at least one value per version")
    if not 0.5 < confidence < 1:
        raise ValueError("confidence must be in (0.5, 1)")
    xs, ys = thin(baseline, cap), thin(candidate, cap)
    n1, n2 = len(xs), len(ys)
    pairs, total = n1 * n2, n1 + n2
    ranks, ties = _rank_sum(xs, ys)
    u = ranks - n2 * (n2 + 1) / 2
    variance = pairs / 12 * (total + 1 - (ties / (total * (total - 1)) if total > 1 else 0))
    sigma = math.sqrt(max(variance, 0.0))
    excess = u - pairs / 2
    if sigma > 0:
        z = math.copysign(max(abs(excess) - 0.5, 0.0), excess) / sigma
        p_two = min(1.0, 2 * normal_upper_tail(abs(z)))
        p_greater = normal_upper_tail((excess - 0.5) / sigma)
    else:  # every value equal: nothing tells the versions apart
        z, p_two, p_greater = 0.0, 1.0, 1.0
    middle = (pairs + 1) // 2
    shift = _kth_difference(xs, ys, middle)
    if pairs % 2 == 0:
        shift = (shift + _kth_difference(xs, ys, middle + 1)) / 2
    k = math.floor(pairs / 2 - statistics.NormalDist().inv_cdf(confidence) * sigma + 0.5)
    low, high = ((_kth_difference(xs, ys, k), _kth_difference(xs, ys, pairs + 1 - k))
                 if 1 <= k <= pairs + 1 - k else (None, None))
    median = statistics.median(xs)

    def relative(value: float | None) -> float | None:
        return None if value is None or median == 0 else value / abs(median)

    return RankTest(u, z, p_two, p_greater, u / pairs, shift, low, high, median, relative(shift),
                    relative(low), relative(high), confidence, (n1, n2), (len(baseline), len(candidate)))


@dataclass(frozen=True)
class ProportionTest:
    """The pooled two-proportion z-test, one-sided "candidate's rate higher"; `low`/`high` the
    Wald bounds of the difference at `confidence` (unpooled: the bounds do not assume equal rates)."""

    baseline_rate: float
    candidate_rate: float
    difference: float
    z: float
    p_greater: float
    low: float
    high: float
    confidence: float
    n: tuple[int, int]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "n": list(self.n)}


def proportion_test(bad_baseline: int, n_baseline: int, bad_candidate: int, n_candidate: int,
                    confidence: float = 0.99) -> ProportionTest:
    """z = (p2 - p1) / sqrt(p (1 - p) (1/n1 + 1/n2)), p the pooled rate; z 0 and p-value 1 when
    neither version had any (or both had only) bad outcomes. The normal approximation wants some
    five bad outcomes per side; with fewer the p-value is rough, so the judge's tolerance, not
    the p-value alone, decides small rates."""
    if n_baseline <= 0 or n_candidate <= 0:
        raise ValueError("a rate needs at least one outcome per version")
    if not (0 <= bad_baseline <= n_baseline and 0 <= bad_candidate <= n_candidate):
        raise ValueError("bad outcomes must be between 0 and the outcomes")
    if not 0.5 < confidence < 1:
        raise ValueError("confidence must be in (0.5, 1)")
    p1, p2 = bad_baseline / n_baseline, bad_candidate / n_candidate
    pooled = (bad_baseline + bad_candidate) / (n_baseline + n_candidate)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_baseline + 1 / n_candidate))
    z = (p2 - p1) / se if se > 0 else 0.0
    margin = statistics.NormalDist().inv_cdf(confidence) * math.sqrt(
        p1 * (1 - p1) / n_baseline + p2 * (1 - p2) / n_candidate)
    return ProportionTest(p1, p2, p2 - p1, z, normal_upper_tail(z) if se > 0 else 1.0,
                          p2 - p1 - margin, p2 - p1 + margin, confidence, (n_baseline, n_candidate))


@dataclass(frozen=True)
class CanaryThresholds:
    alpha: float = 0.01
    max_latency_increase: float = 0.10  # relative Hodges-Lehmann shift of the end-to-end latency
    max_overhead_increase: float = 0.10  # of the platform's own time per request
    max_cost_increase: float = 0.10  # of the AI cost per completed request
    max_added_error_rate: float = 0.01  # absolute: candidate's rate - baseline's
    max_added_dead_letter_rate: float = 0.01
    min_keep_up: float = 0.95  # completions / arrivals on each candidate partition
    min_samples: int = 30  # requests per version for the cost and the rates; fewer: marginal
    interval_s: float = 1.0  # of production time: latency and overhead are judged per interval
    min_intervals: int = 10  # intervals with a request, per version; fewer: marginal

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise ValueError("alpha is a one-sided significance level: in (0, 0.5)")
        for name in ("max_latency_increase", "max_overhead_increase", "max_cost_increase"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name} is a relative increase: finite and not negative")
        for name in ("max_added_error_rate", "max_added_dead_letter_rate"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} is a difference of rates: in [0, 1)")
        if not 0 < self.min_keep_up <= 1:
            raise ValueError("min_keep_up is completions over arrivals: in (0, 1]")
        for name in ("min_samples", "min_intervals"):
            if getattr(self, name) < MIN_SAMPLES_FLOOR:
                raise ValueError(f"{name} must be at least {MIN_SAMPLES_FLOOR}: below it the rank "
                                 "test's normal approximation does not hold")
        if not 0 < self.interval_s < math.inf:
            raise ValueError("interval_s is a positive number of seconds")


@dataclass(frozen=True)
class VersionSample:
    """One version over the analysis window.

    `latencies_s`: each completed request's end-to-end latency (produced -> notified, as
    measure.figures) with when it was produced; `overheads_s`: the platform's own part of it (the
    latency less the time in AI calls), likewise; `costs`: each completed request's AI cost (its
    failed and repeated calls included, as measure.cost charges them), None when the version's
    endpoints are unpriced.
    `completed`, `errors`, `dead_lettered`: the requests it settled in the window, each counted
    once by its outcome (a route's rejection is an answer: completed); the rates are over their
    sum. `partitions`: partition -> (records arrived, records completed) in the window.
    `ai_calls`: the AI calls it made. `member_in_flight`: the records one member holds at most
    (its fetch and concurrency limits), what a partition may have arrived and not completed at
    the window's edge without falling behind."""

    latencies_s: Sequence[Timed]
    overheads_s: Sequence[Timed]
    costs: Sequence[float] | None
    completed: int
    errors: int
    dead_lettered: int
    partitions: Mapping[int, tuple[int, int]]
    ai_calls: int
    member_in_flight: int = 0

    def __post_init__(self) -> None:
        counts = (self.completed, self.errors, self.dead_lettered, self.ai_calls, self.member_in_flight)
        if min(counts) < 0 or any(min(pair) < 0 for pair in self.partitions.values()):
            raise ValueError("counts must not be negative")

    @property
    def handled(self) -> int:
        return self.completed + self.errors + self.dead_lettered


@dataclass(frozen=True)
class Check:
    """One metric's comparison: `measured` the candidate's figure, `baseline` the baseline's,
    `required` the bound in words; `statistic` (z, or the worst shortfall for keep-up),
    `p_value` (one-sided, "candidate worse") and `effect` (the judged shift) where a test ran;
    `interval` the one-sided bounds of the effect; `test` the test's every figure; `note` why
    the outcome is what it is."""

    name: str
    outcome: Outcome
    measured: float | None
    baseline: float | None
    required: str
    statistic: float | None = None
    p_value: float | None = None
    effect: float | None = None
    interval: dict[str, Any] | None = None
    test: dict[str, Any] | None = None
    note: str = ""


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    checks: tuple[Check, ...]
    quota_share: Shares = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "checks": [asdict(c) for c in self.checks],
                "quota_share": {k: dict(v) for k, v in self.quota_share.items()}}

    def summary(self) -> str:
        shown = [c for c in self.checks if c.outcome != PASS] or list(self.checks)
        return f"{self.outcome.upper()}: " + "; ".join(f"{c.name} {c.outcome} ({c.note or c.required})"
                                                      for c in shown)


def _classify(beyond: bool, significant: bool) -> Outcome:
    return FAIL if beyond and significant else MARGINAL if beyond else PASS


def _too_few(n_baseline: int, n_candidate: int, minimum: int, what: str = "requests") -> str:
    return f"not enough data: {n_baseline} baseline and {n_candidate} candidate {what} (< {minimum})"


def _rank_check(name: str, baseline: Sequence[float], candidate: Sequence[float], tolerance: float,
                thresholds: CanaryThresholds, shown: tuple[float | None, float | None], minimum: int,
                what: str) -> Check:
    """A "lower is better" distribution: the rank test of `what` (the values tested, at least
    `minimum` per version), judged on the relative shift. With a baseline median of 0 there is
    no relative shift: any positive shift counts as beyond. `shown` the candidate's and the
    baseline's figures beside the test."""
    required = (f"shift of the {what} <= {tolerance:.0%} of the baseline's median (Hodges-Lehmann); "
                f"fail when beyond it and one-sided Mann-Whitney p < {thresholds.alpha:g}")
    measured, reference = shown
    if not baseline or not candidate:
        return Check(name, MARGINAL, measured, reference, required,
                     note=_too_few(len(baseline), len(candidate), minimum, what))
    test = mann_whitney(baseline, candidate, 1 - thresholds.alpha)
    beyond = test.shift > 0 if test.relative_shift is None else test.relative_shift > tolerance
    significant = test.p_greater < thresholds.alpha
    interval = {"estimate": test.relative_shift, "low": test.relative_low, "high": test.relative_high,
                "confidence": test.confidence}
    if min(test.observed) < minimum:
        outcome: Outcome = MARGINAL
        note = _too_few(*test.observed, minimum, what)
    else:
        outcome = _classify(beyond, significant)
        note = {FAIL: "significantly worse, beyond the tolerance",
                MARGINAL: "beyond the tolerance but not significant",
                PASS: ("significant but " if significant else "") + "within the tolerance"}[outcome]
    return Check(name, outcome, measured, reference, required, test.z, test.p_greater,
                 test.relative_shift, interval, test.as_dict(), note)


def _series_check(name: str, baseline: Sequence[Timed], candidate: Sequence[Timed], tolerance: float,
                  thresholds: CanaryThresholds) -> Check:
    """A time judged as a series: the rank test of each version's per-interval medians (see the
    module docstring), the per-request medians shown."""
    def median(values: Sequence[Timed]) -> float | None:
        return statistics.median(v for _, v in values) if values else None

    return _rank_check(name, interval_medians(baseline, thresholds.interval_s),
                       interval_medians(candidate, thresholds.interval_s), tolerance, thresholds,
                       (median(candidate), median(baseline)), thresholds.min_intervals,
                       f"medians per {thresholds.interval_s:g} s")


def _rate_check(name: str, bad: tuple[int, int], baseline: VersionSample, candidate: VersionSample,
                max_added: float, thresholds: CanaryThresholds) -> Check:
    """A "lower is better" rate, judged on the absolute difference."""
    required = (f"rate <= the baseline's + {max_added:g}; fail when beyond it and one-sided "
                f"two-proportion p < {thresholds.alpha:g}")
    n_b, n_c = baseline.handled, candidate.handled
    measured = bad[1] / n_c if n_c else None
    reference = bad[0] / n_b if n_b else None
    if min(n_b, n_c) < thresholds.min_samples:
        return Check(name, MARGINAL, measured, reference, required,
                     note=_too_few(n_b, n_c, thresholds.min_samples))
    test = proportion_test(bad[0], n_b, bad[1], n_c, 1 - thresholds.alpha)
    outcome = _classify(test.difference > max_added, test.p_greater < thresholds.alpha)
    note = {FAIL: "significantly higher, beyond the tolerance",
            MARGINAL: "beyond the tolerance but not significant", PASS: ""}[outcome]
    return Check(name, outcome, measured, reference, required, test.z, test.p_greater, test.difference,
                 {"estimate": test.difference, "low": test.low, "high": test.high,
                  "confidence": test.confidence}, test.as_dict(), note)


def _worst_keep_up(sample: VersionSample) -> float | None:
    ratios = [done / arrived for arrived, done in sample.partitions.values() if arrived > 0]
    return min(ratios) if ratios else None


def _keep_up(baseline: VersionSample, candidate: VersionSample, minimum: float) -> Check:
    """Each candidate partition's completions / arrivals. A partition is behind when it is below
    `minimum` and its shortfall (arrived - completed) exceeds what one member holds in flight: a
    partition is one member's at a time, and the records that member took in just before the
    window closed have arrived and cannot have completed, however well it keeps up. So a short
    window or a slow AI call does not fail a version that drains its partitions, while a
    backlog growing past one member's in-flight records does. A partition without arrivals
    keeps up."""
    allowance = candidate.member_in_flight
    required = (f">= {minimum:g} completions/arrivals on every candidate partition, or a shortfall of "
                f"at most {allowance} records (one member's in flight)")
    shortfalls = {p: arrived - done for p, (arrived, done) in candidate.partitions.items()}
    behind = sorted(p for p, (arrived, done) in candidate.partitions.items()
                    if arrived > 0 and done < minimum * arrived and shortfalls[p] > allowance)
    worst = max(shortfalls.values(), default=0)
    note = f"partitions behind: {', '.join(map(str, behind))}" if behind else ""
    return Check("keep_up", FAIL if behind else PASS, _worst_keep_up(candidate), _worst_keep_up(baseline),
                 required, statistic=float(worst), note=note)


def quota_shares(baseline: VersionSample, candidate: VersionSample) -> Shares:
    """Each version's share of the AI calls both made against its share of the partitions:
    `calls_over_partitions` is 1 when a version spends the shared quota in proportion to the
    traffic it was given (uneven keys over partitions move it too). None where nothing was made."""
    versions = {"baseline": baseline, "candidate": candidate}
    partitions = sum(len(v.partitions) for v in versions.values())
    calls = sum(v.ai_calls for v in versions.values())
    shares: Shares = {}
    for name, v in versions.items():
        partition_share = len(v.partitions) / partitions if partitions else None
        call_share = v.ai_calls / calls if calls else None
        shares[name] = {"partitions": len(v.partitions), "partition_share": partition_share,
                        "ai_calls": v.ai_calls, "call_share": call_share,
                        "calls_over_partitions": (call_share / partition_share
                                                  if call_share is not None and partition_share else None)}
    return shares


def judge(baseline: VersionSample, candidate: VersionSample,
          thresholds: CanaryThresholds | None = None) -> Verdict:
    """Every check of the candidate against the baseline over the same window: fail if any check
    fails, else marginal if any is, else pass. The cost check passes, saying so, when neither
    version is priced (nothing to compare), and is marginal when only one is."""
    t = thresholds or CanaryThresholds()
    shared = set(baseline.partitions) & set(candidate.partitions)
    if shared:
        raise ValueError(f"partitions {sorted(shared)} in both versions: a canary splits by partitions")
    checks = [
        _series_check("latency", baseline.latencies_s, candidate.latencies_s, t.max_latency_increase, t),
        _series_check("overhead", baseline.overheads_s, candidate.overheads_s, t.max_overhead_increase, t),
    ]
    if baseline.costs is not None and candidate.costs is not None:
        b, c = baseline.costs, candidate.costs
        checks.append(_rank_check("cost_per_request", b, c, t.max_cost_increase, t,
                                  (statistics.fmean(c) if c else None, statistics.fmean(b) if b else None),
                                  t.min_samples, "requests' costs"))
    else:
        priced = baseline.costs is not None or candidate.costs is not None
        checks.append(Check("cost_per_request", MARGINAL if priced else PASS, None, None,
                            f"shift <= {t.max_cost_increase:.0%} of the baseline's median",
                            note="priced in one version only" if priced else "neither version is priced"))
    checks += [
        _rate_check("error_rate", (baseline.errors, candidate.errors), baseline, candidate,
                    t.max_added_error_rate, t),
        _rate_check("dead_letter_rate", (baseline.dead_lettered, candidate.dead_lettered), baseline,
                    candidate, t.max_added_dead_letter_rate, t),
        _keep_up(baseline, candidate, t.min_keep_up),
    ]
    outcome = max((c.outcome for c in checks), key=_SEVERITY.__getitem__)
    return Verdict(outcome, tuple(checks), quota_shares(baseline, candidate))
