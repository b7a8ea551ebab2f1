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
  160 requests over 16 partitions reach 2.1 by chance, which says nothing of the partitioner);
- max_cost_per_request (only when a ceiling is set): the 95% upper bound of the AI cost per
  completed request (`measure.cost`) is at most the ceiling; a trial whose cost is unknown (no
  cost reported, no prices declared) fails it, since nothing shows the ceiling holds;
- latency_objective (only when required): the 95% lower bound of the share of requests within
  the spec's latency objective (`measure.figures.objective_figures`) is at least the share it
  declares; a spec without an objective fails it, since there is nothing to hold the trials to.
Each check is reported with what was measured, what was required and, for the statistical
ones, the interval, so a rejection explains itself in the UI, the logs and the registry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from measure import cost
from measure.confidence import Interval, difference_bounds, mean_bounds

COST_DIGITS = 9  # decimals of a cost per request: a chat call costs some 1e-5


@dataclass(frozen=True)
class Thresholds:
    target_utilization: float = 0.9
    min_throughput_rps: float = 0.0  # optional absolute floor; 0: none
    tolerance: float = 0.1
    max_skew: float = 2.0
    confidence: float = 0.95
    max_cost_per_request: float = 0.0  # optional ceiling on the AI cost per completed request; 0: none
    require_objective: bool = False  # hold the trials to the spec's latency objective

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
        if self.max_cost_per_request < 0:
            raise ValueError("max_cost_per_request must not be negative")


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


def _known(values: Sequence[Any]) -> list[float] | None:
    """The values as numbers; None when one is unknown."""
    known = [v for v in values if v is not None]
    return [float(v) for v in known] if len(known) == len(values) else None


def _values(trials: Sequence[Mapping[str, Any]], key: str) -> list[float] | None:
    return _known([t.get(key) for t in trials])


def _objective_values(trials: Sequence[Mapping[str, Any]], key: str) -> list[float] | None:
    """Each trial's latency objective figure `key`; None when one trial has none."""
    return _known([(t.get("objective") or {}).get(key) for t in trials])


def _costs_per_request(trials: Sequence[Mapping[str, Any]]) -> list[float] | None:
    """Each trial's AI cost per completed request; None when one trial's is unknown."""
    return _known([(t.get("cost") or {}).get("cost_per_request") for t in trials])


def summarise(trials: Sequence[Mapping[str, Any]], confidence: float = 0.95) -> dict[str, Any]:
    """The trials' figures as the report and the UI show them: intervals of the means, totals
    of the counts, the worst skew, the binding limits, the cost over all trials with the
    interval of the cost per request (None for trials from before the cost was recorded), and
    the latency objective with the intervals of the goodput and the share within it (None
    without one)."""
    def bounds(values: list[float] | None, digits: int = 4) -> dict[str, Any] | None:
        return mean_bounds(values, confidence).as_dict(digits) if values and len(values) > 1 else None

    skews = _values(trials, "skew_max_over_mean")
    costed = all("cost" in t for t in trials)
    return {
        "trials": len(trials),
        **{key: bounds(_values(trials, key)) for key in ("utilization", "capacity_rps",
                                                          "steady_throughput_rps", "throughput_rps")},
        "lost": sum(t["lost"] for t in trials),
        "duplicate_ai_calls": sum(t["duplicate_ai_calls"] for t in trials),
        "skew_max_over_mean": max(skews) if skews else None,
        # which limit bound the capacity (measure.capacity), each that did in some trial
        "binding_limits": sorted({t["binding_limit"] for t in trials if t.get("binding_limit")}),
        "cost": cost.combined([t["cost"] for t in trials]) if costed else None,
        "cost_per_request": bounds(_costs_per_request(trials), COST_DIGITS),
        "objective": ({key: trials[0]["objective"][key] for key in ("objective_s", "objective_share")}
                      if all(t.get("objective") for t in trials) else None),
        "goodput_rps": bounds(_objective_values(trials, "goodput_rps")),
        "share_within_objective": bounds(_objective_values(trials, "share_within_objective")),
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


def _cost_ceiling(trials: Sequence[Mapping[str, Any]], ceiling: float, confidence: float) -> Check:
    """The upper bound of the cost per completed request against the ceiling."""
    required = f"<= {ceiling:g} per completed request"
    values = _costs_per_request(trials)
    if values is None:
        return Check("max_cost_per_request", False, None,
                     f"{required}: cost unknown in some trial (no cost reported, no prices declared)")
    interval = mean_bounds(values, confidence)
    return Check("max_cost_per_request", interval.high <= ceiling, round(interval.high, COST_DIGITS),
                 f"{required} ({confidence:.0%} upper bound over {len(values)} trials)",
                 interval.as_dict(COST_DIGITS))


def _objective(trials: Sequence[Mapping[str, Any]], confidence: float) -> Check:
    """The lower bound of the share within the latency objective against the share declared."""
    first = trials[0].get("objective")
    if first is None or not all(t.get("objective") for t in trials):
        return Check("latency_objective", False, None,
                     "the spec declares no latency objective (`objective: {latency_s: ..., share: ...}`)")
    return _lower_bound_check("latency_objective", _objective_values(trials, "share_within_objective"),
                              first["objective_share"], f" of requests within {first['objective_s']:g} s",
                              confidence)


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
    if thresholds.max_cost_per_request > 0:
        checks.append(_cost_ceiling(trials, thresholds.max_cost_per_request, thresholds.confidence))
    if thresholds.require_objective:
        checks.append(_objective(trials, thresholds.confidence))
    return Decision(all(c.passed for c in checks), checks)
