"""The promotion gate: do a candidate's repeated trials justify making it the active version?

A candidate is measured `trials` times (each trial's figures as `measure.figures.run_figures`
gives them) and passes when every check passes:
- utilization: the 95% lower confidence bound (Student's t over the trials) of the share of the
  AI capacity it used is at least the target (default 0.9): the target follows the measured
  capacity, so it needs no working out by hand and holds at any time scale;
- throughput_floor (only when a floor is set): the lower bound of its steady throughput is at
  least that many requests/s;
- regression: the 95% lower bound of (candidate - reference) steady throughput (Welch's t) is
  at least -tolerance x the reference's mean, where the reference is the active version's last
  passed measurement under the same conditions, or the version's own when the candidate is the
  active version (the nightly re-measurement); passed, with that said, when there is none;
- no lost requests and no duplicate AI calls in any trial;
- partition skew (max/mean of requests per partition) in every trial within the bound, or within
  what uniform key hashing explains at that trial's size (`measure.figures.hashing_skew_bound`:
  160 requests over 16 partitions reach 2.1 by chance, which says nothing of the partitioner).
Each check is reported with what was measured, what was required and, for the statistical
ones, the interval, so a rejection explains itself in the UI, the logs and the registry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from measure.confidence import Interval, difference_bounds, mean_bounds


@dataclass(frozen=True)
class Thresholds:
    target_utilization: float = 0.9
    min_throughput_rps: float = 0.0  # optional absolute floor; 0: none
    tolerance: float = 0.1
    max_skew: float = 2.0
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if not 0 <= self.target_utilization <= 1:
            raise ValueError("target_utilization is a share of the AI capacity: in [0, 1]")
        if self.min_throughput_rps < 0:
            raise ValueError("min_throughput_rps must not be negative")
        if not 0 <= self.tolerance < 1:
            raise ValueError("tolerance must be in [0, 1)")
        if self.max_skew < 1:
            raise ValueError("max_skew is a max/mean ratio: at least 1")
        if not 0.5 <= self.confidence < 1:
            raise ValueError("confidence must be in [0.5, 1)")


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    measured: Any
    required: str
    interval: dict[str, Any] | None = None


@dataclass
class Decision:
    passed: bool
    checks: list[Check] = field(default_factory=list)

    def reasons(self) -> list[dict[str, Any]]:
        return [asdict(c) for c in self.checks]

    def summary(self) -> str:
        failed = [c for c in self.checks if not c.passed]
        shown = failed or self.checks
        return ("REJECTED: " if failed else "PASSED: ") + "; ".join(
            f"{c.name} {c.measured} ({c.required})" for c in shown)


def _values(trials: Sequence[Mapping[str, Any]], key: str) -> list[float] | None:
    values = [t.get(key) for t in trials]
    return None if any(v is None for v in values) else [float(v) for v in values]


def summarise(trials: Sequence[Mapping[str, Any]], confidence: float = 0.95) -> dict[str, Any]:
    """The trials' figures as the report and the UI show them: intervals of the means, totals
    of the counts, the worst skew, the binding limits."""
    def bounds(key: str) -> dict[str, Any] | None:
        values = _values(trials, key)
        return mean_bounds(values, confidence).as_dict() if values and len(values) > 1 else None

    skews = _values(trials, "skew_max_over_mean")
    return {
        "trials": len(trials),
        **{key: bounds(key) for key in ("utilization", "capacity_rps", "steady_throughput_rps",
                                        "throughput_rps")},
        "lost": sum(t["lost"] for t in trials),
        "duplicate_ai_calls": sum(t["duplicate_ai_calls"] for t in trials),
        "skew_max_over_mean": max(skews) if skews else None,
        # which limit bound the capacity (measure.capacity), each that did in some trial
        "binding_limits": sorted({t["binding_limit"] for t in trials if t.get("binding_limit")}),
    }


def _lower_bound_check(name: str, values: list[float] | None, minimum: float, unit: str,
                       confidence: float) -> Check:
    if values is None:
        return Check(name, False, None, f">= {minimum}{unit}: not measured in every trial")
    interval = mean_bounds(values, confidence)
    return Check(name, interval.low >= minimum, round(interval.low, 4),
                 f">= {minimum}{unit} ({confidence:.0%} lower bound over {len(values)} trials)",
                 interval.as_dict())


def _regression(candidate: list[float] | None, reference: Sequence[float] | None, tolerance: float,
                confidence: float) -> Check:
    if not reference:
        return Check("regression", True, None, "no earlier measurement under the same conditions")
    if candidate is None:
        return Check("regression", False, None, "steady throughput not measured in every trial")
    interval: Interval = difference_bounds(candidate, reference, confidence)
    mean = sum(reference) / len(reference)
    floor = -tolerance * mean
    return Check("regression", interval.low >= floor, round(interval.low, 3),
                 f">= {floor:.2f} rps difference: within {tolerance:.0%} of the reference's "
                 f"{mean:.2f} rps ({confidence:.0%} lower bound, {len(candidate)} vs "
                 f"{len(reference)} trials)", interval.as_dict(3))


def _skew(trials: Sequence[Mapping[str, Any]], max_skew: float) -> Check:
    """Each trial within max(max_skew, its hashing bound); reported for the trial nearest its own."""
    skews = _values(trials, "skew_max_over_mean")
    if skews is None:
        return Check("partition_skew", False, None, f"<= {max_skew} (max/mean): not measured in every trial")
    allowed = [max(max_skew, t.get("skew_hashing_bound") or 0.0) for t in trials]
    worst = max(range(len(trials)), key=lambda i: skews[i] / allowed[i])
    return Check("partition_skew", all(s <= a for s, a in zip(skews, allowed, strict=True)), skews[worst],
                 f"<= {allowed[worst]:g} (max/mean: {max_skew:g}, or what uniform hashing of the trial's "
                 "requests explains)")


def evaluate(trials: Sequence[Mapping[str, Any]], thresholds: Thresholds,
             reference: Sequence[float] | None) -> Decision:
    """Apply every check to the trials' figures; `reference`: the steady throughputs (rps) to
    compare with, None when there is nothing comparable."""
    if len(trials) < 2:
        raise ValueError(f"the gate decides on confidence bounds: at least 2 trials, got {len(trials)}")
    if reference is not None and len(reference) < 2:
        raise ValueError(f"a reference needs at least 2 trials, got {len(reference)}")
    steady = _values(trials, "steady_throughput_rps")
    checks = [_lower_bound_check("utilization", _values(trials, "utilization"),
                                 thresholds.target_utilization, " of the AI capacity", thresholds.confidence)]
    if thresholds.min_throughput_rps > 0:
        checks.append(_lower_bound_check("throughput_floor", steady, thresholds.min_throughput_rps,
                                         " rps steady", thresholds.confidence))
    checks.append(_regression(steady, reference, thresholds.tolerance, thresholds.confidence))
    lost = sum(t["lost"] for t in trials)
    duplicates = sum(t["duplicate_ai_calls"] for t in trials)
    checks += [
        Check("lost_requests", lost == 0, lost, "== 0 over all trials"),
        Check("duplicate_ai_calls", duplicates == 0, duplicates, "== 0 over all trials"),
        _skew(trials, thresholds.max_skew),
    ]
    return Decision(all(c.passed for c in checks), checks)
