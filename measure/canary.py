"""The canary judge: does a candidate version of a pipeline's consumers do worse than the active
one over the same minutes of the same traffic?

A canary splits a topic by partitions: the candidate's members consume some, the baseline's
(the active version's) the rest, side by side. After each step's analysis window the judge
compares the two versions metric by metric, as Kayenta's NetflixACAJudge does: a rank test per
metric, classified pass / marginal / fail, the verdict the worst of the checks.

- times as series (`interval_medians`): latency and overhead are judged on each version's
  median per interval of production time, not per request. Requests one process handles in
  the same second share that second's stalls (a pause of the process, a slow batch of commits),
  so they are not independent, and a test that counts them as such overstates its evidence the
  fewer processes a side has: a canary's first step is one member holding one partition. The
  intervals' medians are about as independent as the stalls are short. The two versions'
  medians are then compared interval by interval (the signed-rank test of their differences,
  `measure.signed_rank`): both ran over the same seconds, so what slowed every process in a
  second (the machine's load, the broker, the AI endpoint, the hour's traffic) cancels in the
  pair instead of drowning the shift. The cost per request stays per request and unpaired (the
  Mann-Whitney test, `measure.two_sample`): what a request's tokens cost does not depend on when
  it ran.
- classification of a "lower is better" metric: fail when the candidate is significantly worse
  (one-sided p < alpha) and its shift (relative for the distributions, absolute for the rates)
  is beyond the tolerance; marginal when the shift is beyond the tolerance without being
  significant, or when there are fewer values than it takes (`min_intervals` served by both
  versions, `min_samples` per version); pass otherwise. A significant but small shift passes:
  with thousands of requests a 2 % difference is significant, and the tolerance says what is
  worth holding a release for.
- keep-up: each candidate partition's completions over its arrivals in the window (see
  `_keep_up`): splitting by partitions only works if every partition is drained.
- quota share (reported, not judged): each version's share of the AI calls against its share of
  the partitions, since both versions spend the same provider quota.

The shifts are Hodges-Lehmann estimates with distribution-free bounds; the rates take the
two-proportion test. Bounds are one-sided at 1 - alpha: [low, high] is the two-sided interval
at 1 - 2 alpha.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from measure.signed_rank import MIN_PAIRS_FLOOR, SignedRankTest, signed_rank
from measure.two_sample import MIN_SAMPLES_FLOOR, RankTest, ShiftTest, mann_whitney, proportion_test

Outcome = Literal["pass", "marginal", "fail"]
PASS: Outcome = "pass"
MARGINAL: Outcome = "marginal"
FAIL: Outcome = "fail"
_SEVERITY: dict[Outcome, int] = {PASS: 0, MARGINAL: 1, FAIL: 2}
Shares = dict[str, dict[str, float | int | None]]  # version -> its figures of the shared quota
Timed = tuple[float, float]  # (when its request was produced, epoch seconds; the value)


def interval_medians(values: Sequence[Timed], interval_s: float) -> dict[int, float]:
    """The median of the values produced in each interval of `interval_s` seconds, by the
    interval's number counted from the epoch (so both versions' line up), in time order;
    intervals without a value give none."""
    if not interval_s > 0:
        raise ValueError("an interval is a positive number of seconds")
    grouped: dict[int, list[float]] = {}
    for at, value in values:
        grouped.setdefault(math.floor(at / interval_s), []).append(value)
    return {k: statistics.median(grouped[k]) for k in sorted(grouped)}


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
    min_intervals: int = 10  # intervals with a request of both versions; fewer: marginal

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
        for name, floor in (("min_samples", MIN_SAMPLES_FLOOR), ("min_intervals", MIN_PAIRS_FLOOR)):
            if getattr(self, name) < floor:
                raise ValueError(f"{name} must be at least {floor}: below it the rank "
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
        """The outcome and each check that did not pass (all of them when every one did), with its
        figures beside the baseline's and the shift's bounds: what a reader of a log needs to see
        how far from its tolerance a check was."""
        shown = [c for c in self.checks if c.outcome != PASS] or list(self.checks)
        return f"{self.outcome.upper()}: " + "; ".join(_described(c) for c in shown)


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _described(check: Check) -> str:
    said = f"{check.name} {check.outcome} ({check.note or check.required}"
    if check.measured is not None or check.baseline is not None:
        said += f"; {_figure(check.measured)} against {_figure(check.baseline)}"
    if check.interval is not None:
        i = check.interval
        said += f"; shift {_figure(i['estimate'])} [{_figure(i['low'])}, {_figure(i['high'])}]"
    if check.p_value is not None:
        said += f", p {check.p_value:.3g}"
    return said + ")"


def _classify(beyond: bool, significant: bool) -> Outcome:
    return FAIL if beyond and significant else MARGINAL if beyond else PASS


def _too_few(n_baseline: int, n_candidate: int, minimum: int, what: str = "requests") -> str:
    return f"not enough data: {n_baseline} baseline and {n_candidate} candidate {what} (< {minimum})"


def _shift_check(name: str, test: ShiftTest, observed: int, tolerance: float,
                 thresholds: CanaryThresholds, shown: tuple[float | None, float | None], minimum: int,
                 what: str, too_few: str) -> Check:
    """A "lower is better" shift judged on its relative size: beyond the tolerance and
    significant fails. With a baseline median of 0 there is no relative shift: any positive
    shift counts as beyond. `observed` the values (or pairs) the test had, at least `minimum`,
    else marginal with the note `too_few`."""
    required = _required(what, tolerance, test.test_name, thresholds.alpha)
    beyond = test.shift > 0 if test.relative_shift is None else test.relative_shift > tolerance
    significant = test.p_greater < thresholds.alpha
    interval = {"estimate": test.relative_shift, "low": test.relative_low, "high": test.relative_high,
                "confidence": test.confidence}
    if observed < minimum:
        outcome: Outcome = MARGINAL
        note = too_few
    else:
        outcome = _classify(beyond, significant)
        note = {FAIL: "significantly worse, beyond the tolerance",
                MARGINAL: "beyond the tolerance but not significant",
                PASS: ("significant but " if significant else "") + "within the tolerance"}[outcome]
    return Check(name, outcome, shown[0], shown[1], required, test.z, test.p_greater,
                 test.relative_shift, interval, test.as_dict(), note)



def _required(what: str, tolerance: float, test_name: str, alpha: float) -> str:
    return (f"shift of the {what} <= {tolerance:.0%} of the baseline's median (Hodges-Lehmann); "
            f"fail when beyond it and one-sided {test_name} p < {alpha:g}")


def _rank_check(name: str, baseline: Sequence[float], candidate: Sequence[float], tolerance: float,
                thresholds: CanaryThresholds, shown: tuple[float | None, float | None], what: str) -> Check:
    """Two independent samples (the requests' costs): the rank test, at least `min_samples`
    values per version."""
    if not baseline or not candidate:
        return Check(name, MARGINAL, *shown, _required(what, tolerance, RankTest.test_name, thresholds.alpha),
                     note=_too_few(len(baseline), len(candidate), thresholds.min_samples, what))
    test = mann_whitney(baseline, candidate, 1 - thresholds.alpha)
    return _shift_check(name, test, min(test.observed), tolerance, thresholds, shown, thresholds.min_samples,
                        what, _too_few(*test.observed, thresholds.min_samples, what))


def _series_check(name: str, baseline: Sequence[Timed], candidate: Sequence[Timed], tolerance: float,
                  thresholds: CanaryThresholds) -> Check:
    """A time judged as a series (see the module docstring): the signed-rank test of the two
    versions' medians over the intervals both served, paired by interval, the per-request
    medians shown."""
    def median(values: Sequence[Timed]) -> float | None:
        return statistics.median(v for _, v in values) if values else None

    what = f"medians per {thresholds.interval_s:g} s"
    shown = (median(candidate), median(baseline))
    ours, theirs = (interval_medians(v, thresholds.interval_s) for v in (baseline, candidate))
    paired = sorted(ours.keys() & theirs.keys())
    too_few = (f"not enough data: {len(paired)} intervals both versions served "
               f"({len(ours)} baseline, {len(theirs)} candidate; < {thresholds.min_intervals})")
    if not paired:
        required = _required(what, tolerance, SignedRankTest.test_name, thresholds.alpha)
        return Check(name, MARGINAL, *shown, required, note=too_few)
    test = signed_rank([ours[k] for k in paired], [theirs[k] for k in paired], 1 - thresholds.alpha)
    return _shift_check(name, test, len(paired), tolerance, thresholds, shown, thresholds.min_intervals,
                        what, too_few)


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
                                  "requests' costs"))
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
