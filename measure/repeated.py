"""A figure of a benchmark run several times: its mean with a two-sided 95 % interval, and a
ratio between two scenarios taken repetition by repetition.

Why per repetition: the repetitions are interleaved (every scenario once, then again), so the
machine's drift over a run (a warmer JIT, a fuller disk, a neighbour's load) falls on both sides
of a ratio alike within one repetition; the mean of the per-repetition ratios keeps that
pairing, where the ratio of two means would add both sides' drift to its interval. The
interval is Student's t on the repetitions' values (measure.confidence), exact under normality
at any count, which the gate's trials already rely on.

A difference is `within_noise` when its interval holds the value of no difference (1 for a
ratio, 0 for a difference of points): the repetitions do not tell the two apart."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from measure import confidence

ONE_SIDED = 0.975  # each bound's confidence: [low, high] is the two-sided 95 % interval


@dataclass(frozen=True)
class Repeated:
    """A figure's values over the repetitions, their mean and its 95 % interval (None with one
    value: one run has no spread to bound)."""

    values: tuple[float, ...]
    mean: float
    low: float | None
    high: float | None

    def within_noise(self, none: float) -> bool | None:
        """Whether the interval holds `none`, the value of no difference (None: no interval)."""
        if self.low is None or self.high is None:
            return None
        return self.low <= none <= self.high

    def as_dict(self, digits: int = 4) -> dict[str, Any]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, digits)

        return {"mean": rounded(self.mean), "low": rounded(self.low), "high": rounded(self.high),
                "n": len(self.values), "values": [rounded(v) for v in self.values]}


def repeated(values: Sequence[float]) -> Repeated:
    """The mean of one figure's values (at least one) and its two-sided 95 % interval."""
    if not values:
        raise ValueError("a repeated figure needs at least one value")
    found = tuple(float(v) for v in values)
    if len(found) == 1:
        return Repeated(found, found[0], None, None)
    bounds = confidence.mean_bounds(found, ONE_SIDED)
    return Repeated(found, bounds.estimate, bounds.low, bounds.high)


def numeric(value: Any) -> bool:
    """A figure that has a mean: a number, not a flag."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def figures_over(repetitions: Sequence[Mapping[str, Any]]) -> dict[str, Repeated]:
    """Each top-level numeric figure that every repetition of one scenario reports."""
    if not repetitions:
        return {}
    names = [k for k, v in repetitions[0].items() if numeric(v)]
    return {k: repeated([r[k] for r in repetitions])
            for k in names if all(numeric(r.get(k)) for r in repetitions)}


def ratio_over(numerators: Sequence[float | None], denominators: Sequence[float | None]) -> Repeated | None:
    """numerator / denominator in each repetition where both were measured (None: in none)."""
    found = [a / b for a, b in zip(numerators, denominators, strict=True)
             if a is not None and b is not None and b != 0]
    return repeated(found) if found else None


def difference_over(minuends: Sequence[float | None], subtrahends: Sequence[float | None]) -> Repeated | None:
    """minuend - subtrahend in each repetition where both were measured (None: in none)."""
    found = [a - b for a, b in zip(minuends, subtrahends, strict=True) if a is not None and b is not None]
    return repeated(found) if found else None
