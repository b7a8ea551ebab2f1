"""The figures of a run whose records may wait for a cheaper tier, defined once.

- deadline misses: the records allowed to wait whose stage answer was recorded after their
  deadline, or never (`deadline_misses`, over each record's seconds from produced to recorded);
- a cost per 1,000 completed requests (`per_1k`): a cost over the completed requests x 1,000,
  unknown (None) when the cost is;
- an arm's figure against another's over repetitions (`ratio_of_means`): the mean of one over
  the mean of the other, unknown when either is for any repetition.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def deadline_misses(recorded_after_s: Sequence[float | None], within_s: float) -> int:
    """The records answered later than `within_s` after they were produced, or not at all (None)."""
    return sum(1 for after in recorded_after_s if after is None or after > within_s)


def per_1k(cost: float | None, completed: int) -> float | None:
    return None if cost is None or completed <= 0 else 1000 * cost / completed


def ratio_of_means(pairs: Sequence[tuple[float | None, float | None]]) -> float | None:
    """mean(first) / mean(second) over the repetitions' (first, second) figures."""
    if not pairs or any(a is None or b is None for a, b in pairs):
        return None
    below = statistics.fmean(b for _, b in pairs if b is not None)
    return statistics.fmean(a for a, _ in pairs if a is not None) / below if below else None
