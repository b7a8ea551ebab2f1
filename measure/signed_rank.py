"""A paired test of a candidate against a baseline, "lower is better": Wilcoxon's signed-rank
test of the differences candidate - baseline, one per pair (for a canary: per interval of
production time both versions served).

Pairing is what makes a side-by-side comparison sharp: both versions run over the same seconds,
so what slows every process in a second (the machine's load, the broker, the AI endpoint, the
hour's traffic) moves both values of its pair and cancels in their difference. An unpaired test
counts that shared variation as evidence against neither and needs far more seconds to see the
same shift.

- The test: W+ the sum of the ranks of |d| over the positive differences (zero differences
  dropped, as Wilcoxon did; ties at their mid-rank), z under the normal approximation with the
  tie-corrected variance and a continuity correction, the one-sided p for "candidate larger".
- The shift: the Hodges-Lehmann estimate, the median of the Walsh averages (d_i + d_j) / 2 over
  i <= j of every difference, zeros included; its distribution-free bounds the k-th smallest and
  largest Walsh average, k from the same normal approximation; relative to the baseline's
  median like `two_sample.mann_whitney`'s.

Bounds are one-sided at `confidence`: [low, high] is the two-sided interval at 2 confidence - 1.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from measure.two_sample import ShiftTest, continuity_z, evenly_spaced, marked_rank_sum, relative_to

# Pairs kept: the shift sorts n (n + 1) / 2 Walsh averages. Above it, pairs at evenly spaced
# positions in the given (time) order, so a long window keeps its whole span.
MAX_PAIRS = 1000
# Against W+'s exact distribution (no ties), the continuity-corrected normal approximation is off
# by at most 0.0084 in p at 10 pairs and 0.0028 at 30; near p = 0.01 it overstates p by 18 % at
# 10 and 8 % at 30, on the conservative side.
MIN_PAIRS_FLOOR = 10


@dataclass(frozen=True)
class SignedRankTest(ShiftTest):
    """The signed-rank test of paired differences (see the module docstring): `w` is W+, `n` the
    pairs used and `nonzero` those the test ranked, `observed` the pairs before thinning."""

    w: float
    n: int
    nonzero: int
    observed: int
    test_name: ClassVar[str] = "signed-rank"


def signed_rank(baseline: Sequence[float], candidate: Sequence[float], confidence: float = 0.99,
                cap: int = MAX_PAIRS) -> SignedRankTest:
    """The paired test of `candidate[i]` against `baseline[i]`, thinned to `cap` pairs.

    z = (W+ - m (m + 1) / 4 -+ 1/2) / sigma, sigma^2 = m (m + 1) (2 m + 1) / 24 - sum(t^3 - t) / 48
    over the m nonzero differences, the correction of 1/2 toward 0; the one-sided p takes it
    toward the alternative. The shift's bounds: k = round(N / 2 - z_c s), N = n (n + 1) / 2 Walsh
    averages, s^2 = n (n + 1) (2 n + 1) / 24 over all n pairs.
    """
    if len(baseline) != len(candidate):
        raise ValueError("a paired test needs as many candidate values as baseline values")
    if not baseline:
        raise ValueError("a paired test needs at least one pair")
    if not 0.5 < confidence < 1:
        raise ValueError("confidence must be in (0.5, 1)")
    if cap < 2:
        raise ValueError("a thinned sample keeps at least 2 pairs")
    xs, ys = evenly_spaced(baseline, cap), evenly_spaced(candidate, cap)
    differences = [y - x for x, y in zip(xs, ys, strict=True)]
    nonzero = sorted((abs(d), d > 0) for d in differences if d != 0)  # zeros dropped (Wilcoxon)
    w, ties = marked_rank_sum(nonzero)  # ranks of |d| over the positive differences
    m = len(nonzero)
    sigma = math.sqrt(max(m * (m + 1) * (2 * m + 1) / 24 - ties / 48, 0.0))
    excess = w - m * (m + 1) / 4
    z, p_two, p_greater = continuity_z(excess, sigma)
    n = len(differences)
    walsh = sorted((differences[i] + differences[j]) / 2 for i in range(n) for j in range(i, n))
    shift = statistics.median(walsh)
    spread = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    k = math.floor(len(walsh) / 2 - statistics.NormalDist().inv_cdf(confidence) * spread + 0.5)
    low, high = (walsh[k - 1], walsh[len(walsh) - k]) if 1 <= k <= len(walsh) + 1 - k else (None, None)
    median = statistics.median(xs)
    return SignedRankTest(z, p_two, p_greater, shift, low, high, median, relative_to(median, shift),
                          relative_to(median, low), relative_to(median, high), confidence, w=w, n=n,
                          nonzero=m, observed=len(baseline))
