"""Two-sample tests of a candidate against a baseline, "lower is better": the candidate worse
when its values run larger.

- `mann_whitney`: U of the candidate (pairs where the candidate's value is the
  larger, ties counted half), its z under the normal approximation with the tie-corrected
  variance and a continuity correction, the one-sided p-value for "candidate larger" (for
  latency, overhead and cost: worse) and the two-sided one. Effect sizes: the probability of
  superiority U / (n1 n2) = P(candidate > baseline) + P(tie) / 2, and the Hodges-Lehmann shift
  (the median of every candidate - baseline difference) over the baseline's median, with the
  distribution-free (Moses) bounds of the shift from the same normal approximation. Ranks
  rather than means: latencies are heavy-tailed, and a few slow calls move a mean and a
  t-test's variance far more than they move which version is typically faster.
- `proportion_test`: the pooled two-proportion z-test, one-sided "candidate's rate
  higher", for the error and dead-letter rates; with Wald bounds of the difference.

Bounds are one-sided at `confidence`, as in measure.confidence: [low, high] is the two-sided
interval at 2 confidence - 1. Plain Python like measure.confidence: no SciPy here.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

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


def continuity_z(excess: float, sigma: float) -> tuple[float, float, float]:
    """A rank statistic's z, two-sided p and one-sided p ("candidate larger") under the normal
    approximation, `excess` its distance from its mean: a continuity correction of 1/2 toward
    0 (0 within 1/2), the one-sided p's toward the alternative. With sigma 0 every value is
    equal and nothing tells the versions apart: z 0, p 1."""
    if sigma <= 0:
        return 0.0, 1.0, 1.0
    z = math.copysign(max(abs(excess) - 0.5, 0.0), excess) / sigma
    return z, min(1.0, 2 * normal_upper_tail(abs(z))), normal_upper_tail((excess - 0.5) / sigma)


def thin(values: Sequence[float], cap: int = MAX_SAMPLE) -> list[float]:
    """The values sorted, and above `cap` of them `cap` at evenly spaced ranks (every k-th, k
    fractional, the first and last included): each quantile stays within half a stride of the
    original's, and with an odd count and an odd cap the median is kept exactly. Deterministic,
    unlike a random subsample, so a verdict can be recomputed."""
    if cap < 2:
        raise ValueError("a thinned sample keeps at least 2 values")
    return evenly_spaced(sorted(values), cap)


def evenly_spaced(values: Sequence[float], cap: int) -> list[float]:
    """`cap` of the values at evenly spaced positions, the first and last included (all of them
    when there are no more than `cap`)."""
    n = len(values)
    if n <= cap:
        return list(values)
    stride = 2 * (cap - 1)  # position i * (n - 1) / (cap - 1), rounded half up, in integers
    return [values[(2 * i * (n - 1) + cap - 1) // stride] for i in range(cap)]


@dataclass(frozen=True)
class ShiftTest:
    """What a rank test of a candidate against a baseline gives, paired or not: z, the
    p-values (one-sided for "candidate larger"), the Hodges-Lehmann shift with its one-sided
    bounds at `confidence`, and each relative to the baseline's median (None when that median
    is 0; a bound None when the samples are too small to give one)."""

    z: float
    p_two_sided: float
    p_greater: float
    shift: float
    shift_low: float | None
    shift_high: float | None
    baseline_median: float
    relative_shift: float | None
    relative_low: float | None
    relative_high: float | None
    confidence: float
    test_name: ClassVar[str]  # as a check's bound names it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def relative_to(median: float, value: float | None) -> float | None:
    """`value` over the baseline's median; None without a value or with a median of 0."""
    return None if value is None or median == 0 else value / abs(median)


@dataclass(frozen=True)
class RankTest(ShiftTest):
    """Mann-Whitney U of the candidate against the baseline (see the module docstring); `n` the
    values used per side (baseline, candidate), `observed` before thinning."""

    u: float
    superiority: float
    n: tuple[int, int]
    observed: tuple[int, int]
    test_name: ClassVar[str] = "Mann-Whitney"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "n": list(self.n), "observed": list(self.observed)}


def marked_rank_sum(ordered: Sequence[tuple[float, bool]]) -> tuple[float, int]:
    """Over values in ascending order, each marked or not: the sum of the marked ones' ranks
    (from 1, tied values at their mid-rank) and the tie term sum(t^3 - t) over the groups of
    tied values."""
    ranks, ties, i = 0.0, 0, 0
    while i < len(ordered):
        j = i
        while j < len(ordered) and ordered[j][0] == ordered[i][0]:
            j += 1
        ranks += sum(marked for _, marked in ordered[i:j]) * (i + 1 + j) / 2  # ranks i + 1 .. j
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
    ranks, ties = marked_rank_sum(sorted([(v, False) for v in xs] + [(v, True) for v in ys]))  # ys' ranks
    u = ranks - n2 * (n2 + 1) / 2
    variance = pairs / 12 * (total + 1 - (ties / (total * (total - 1)) if total > 1 else 0))
    sigma = math.sqrt(max(variance, 0.0))
    excess = u - pairs / 2
    z, p_two, p_greater = continuity_z(excess, sigma)
    middle = (pairs + 1) // 2
    shift = _kth_difference(xs, ys, middle)
    if pairs % 2 == 0:
        shift = (shift + _kth_difference(xs, ys, middle + 1)) / 2
    k = math.floor(pairs / 2 - statistics.NormalDist().inv_cdf(confidence) * sigma + 0.5)
    low, high = ((_kth_difference(xs, ys, k), _kth_difference(xs, ys, pairs + 1 - k))
                 if 1 <= k <= pairs + 1 - k else (None, None))
    median = statistics.median(xs)
    return RankTest(z, p_two, p_greater, shift, low, high, median, relative_to(median, shift),
                    relative_to(median, low), relative_to(median, high), confidence, u=u,
                    superiority=u / pairs, n=(n1, n2), observed=(len(baseline), len(candidate)))


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
