"""What the repetitions of a benchmark add up to: each scenario's figures and each comparison
between scenarios as a mean with its 95 % interval (measure/repeated.py).

A comparison is taken within each repetition and then averaged, because the repetitions are
interleaved: every scenario runs once before any runs again, so a drift of the machine over the
run reaches both sides of a comparison in the same repetition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from measure.repeated import Repeated, difference_over, figures_over, ratio_over

Runs = Sequence[Mapping[str, Mapping[str, Any]]]  # per repetition: each scenario's figures


@dataclass(frozen=True)
class Comparison:
    """One scenario's figure against another's: their ratio, or with `points` the difference of
    two shares in percentage points."""

    name: str
    scenario: str
    against: str
    figure: str = "throughput_rps"
    points: bool = False

    def over(self, runs: Runs) -> Repeated | None:
        """Across the repetitions where both scenarios ran and measured the figure."""
        def values(scenario: str) -> list[float | None]:
            return [run[scenario].get(self.figure) if scenario in run else None for run in runs]

        if self.points:
            return difference_over(*([None if v is None else 100 * v for v in values(name)]
                                     for name in (self.scenario, self.against)))
        return ratio_over(values(self.scenario), values(self.against))

    @property
    def none(self) -> float:
        """The value that means no difference."""
        return 0.0 if self.points else 1.0


COMPARISONS = (
    Comparison("tuned_over_baseline", "tuned", "baseline"),
    Comparison("flow_over_baseline", "flow", "baseline"),
    Comparison("flow_over_tuned", "flow", "tuned"),
    Comparison("flow_kip848_over_flow", "flow-kip848", "flow"),
    Comparison("flow_exactly_once_over_flow", "flow-exactly-once", "flow"),
    Comparison("flow_exactly_once_over_flow_p99", "flow-exactly-once", "flow", "p99_ms"),
    Comparison("flow_exactly_once_over_flow_span", "flow-exactly-once", "flow", "span_s"),
    Comparison("flow_adaptive_over_flow", "flow-adaptive", "flow"),
    Comparison("share_over_flow", "share", "flow"),
    Comparison("durable_over_flow", "durable", "flow"),
    Comparison("durable_minus_flow_utilization_points", "durable", "flow", "utilization", points=True),
)


def scenario_figures(runs: Runs) -> dict[str, dict[str, dict[str, Any]]]:
    """Each scenario's numeric figures over the repetitions that ran it."""
    names = list(dict.fromkeys(name for run in runs for name in run))
    return {name: {figure: r.as_dict() for figure, r in
                   figures_over([run[name] for run in runs if name in run]).items()}
            for name in names}


def comparisons(runs: Runs) -> dict[str, dict[str, Any] | None]:
    """Every comparison whose two scenarios ran, with whether the repetitions tell them apart."""
    found: dict[str, dict[str, Any] | None] = {}
    for c in COMPARISONS:
        r = c.over(runs)
        found[c.name] = None if r is None else {**r.as_dict(3), "within_noise": r.within_noise(c.none)}
    return found
