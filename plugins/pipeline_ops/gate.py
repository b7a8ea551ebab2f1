"""The promotion gate: does a candidate's measured run justify making it the active version?

It passes when every check passes:
- throughput >= the absolute target;
- throughput >= (1 - tolerance) x the active configuration's last measured throughput (skipped,
  with that said, when nothing is active yet or the candidate is the active version itself);
- no lost requests and no duplicate AI calls;
- partition skew (max/mean of requests per partition) within the bound.
Each check is reported with what was measured and what was required, so a rejection explains
itself in the UI, the logs and the registry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    min_throughput_rps: float
    tolerance: float = 0.1
    max_skew: float = 2.0

    def __post_init__(self) -> None:
        if self.min_throughput_rps < 0:
            raise ValueError("min_throughput_rps must not be negative")
        if not 0 <= self.tolerance < 1:
            raise ValueError("tolerance must be in [0, 1)")
        if self.max_skew < 1:
            raise ValueError("max_skew is a max/mean ratio: at least 1")


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    measured: Any
    required: str


@dataclass
class Decision:
    passed: bool
    checks: list[Check] = field(default_factory=list)

    def reasons(self) -> list[dict[str, Any]]:
        return [asdict(c) for c in self.checks]

    def summary(self) -> str:
        failed = [c for c in self.checks if not c.passed]
        if not failed:
            return "PASSED: " + "; ".join(f"{c.name} {c.measured} ({c.required})" for c in self.checks)
        return "REJECTED: " + "; ".join(f"{c.name} {c.measured} ({c.required})" for c in failed)


def evaluate(figures: dict[str, Any], thresholds: Thresholds,
             active_throughput_rps: float | None) -> Decision:
    """Apply every check to a run's figures (throughput_rps, lost, duplicate_ai_calls, skew)."""
    rps = float(figures["throughput_rps"])
    checks = [Check("throughput", rps >= thresholds.min_throughput_rps, round(rps, 2),
                    f">= {thresholds.min_throughput_rps} rps")]
    if active_throughput_rps is None:
        checks.append(Check("regression", True, None, "no active measurement to compare with"))
    else:
        floor = (1 - thresholds.tolerance) * active_throughput_rps
        checks.append(Check("regression", rps >= floor, round(rps, 2),
                            f">= {floor:.2f} rps ({1 - thresholds.tolerance:.0%} of active "
                            f"{active_throughput_rps:.2f})"))
    checks += [
        Check("lost_requests", figures["lost"] == 0, figures["lost"], "== 0"),
        Check("duplicate_ai_calls", figures["duplicate_ai_calls"] == 0, figures["duplicate_ai_calls"],
              "== 0"),
        Check("partition_skew", figures["skew_max_over_mean"] <= thresholds.max_skew,
              round(figures["skew_max_over_mean"], 3), f"<= {thresholds.max_skew} (max/mean)"),
    ]
    return Decision(all(c.passed for c in checks), checks)
