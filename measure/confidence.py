"""Confidence bounds from a few repeated trials: Student's t for one mean, Welch's t for the
difference of two means.

Why t and not the bootstrap: the gate decides on three trials by default, and a bootstrap of
three values has ten distinct resamples whose spread understates the real one, so its bounds
are too narrow exactly where it matters. Each trial's figure is itself an average over
hundreds of completions, close enough to normal for the t-interval, which is exact under
normality at any sample size. Bounds are one-sided at `confidence` (the gate asks "at least",
never "at most"): `low` is the 95% lower bound, `high` the matching upper one, so [low, high]
is the two-sided interval at 2 x confidence - 1 (90%).

No SciPy in the environment: the t quantile comes from the regularized incomplete beta
function (continued fraction, as in Numerical Recipes) inverted by bisection.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

_EPS = 3e-14
_TINY = 1e-300


def _beta_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 300):
        for aa in (m * (b - m) * x / ((qam + 2 * m) * (a + 2 * m)),
                   -(a + m) * (qab + m) * x / ((a + 2 * m) * (qap + 2 * m))):
            d = 1 + aa * d
            d = 1 / (d if abs(d) > _TINY else _TINY)
            c = 1 + aa / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1) < _EPS:
            break
    return h


def _regularized_beta(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom (df may be fractional: Welch)."""
    tail = 0.5 * _regularized_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t value below which a share `p` (0.5 <= p < 1) of the distribution lies."""
    if not 0.5 <= p < 1 or df <= 0:
        raise ValueError(f"need 0.5 <= p < 1 and df > 0, got p={p}, df={df}")
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class Interval:
    """An estimate with one-sided bounds at `confidence` on either side (see the module
    docstring); df is None when the trials did not vary at all (the bounds are the estimate)."""

    estimate: float
    low: float
    high: float
    confidence: float
    df: float | None
    n: tuple[int, ...]

    def as_dict(self, digits: int = 4) -> dict[str, Any]:
        return {**asdict(self), "estimate": round(self.estimate, digits), "low": round(self.low, digits),
                "high": round(self.high, digits), "df": None if self.df is None else round(self.df, 2),
                "n": list(self.n)}


def _interval(estimate: float, se: float, df: float, confidence: float, n: tuple[int, ...]) -> Interval:
    if se == 0:
        return Interval(estimate, estimate, estimate, confidence, None, n)
    margin = t_quantile(confidence, df) * se
    return Interval(estimate, estimate - margin, estimate + margin, confidence, df, n)


def mean_bounds(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student's t bounds of the mean of `values` (at least two)."""
    if len(values) < 2:
        raise ValueError(f"a confidence bound needs at least 2 trials, got {len(values)}")
    se = statistics.stdev(values) / math.sqrt(len(values))
    return _interval(statistics.fmean(values), se, len(values) - 1, confidence, (len(values),))


def difference_bounds(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Interval:
    """Welch's t bounds of mean(a) - mean(b): no equal-variance assumption, Welch-Satterthwaite df."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"a confidence bound needs at least 2 trials per side, got {len(a)} and {len(b)}")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if se else 0.0
    return _interval(statistics.fmean(a) - statistics.fmean(b), se, df, confidence, (len(a), len(b)))
