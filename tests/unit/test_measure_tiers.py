"""The tier figures (measure.tiers) on values written out by hand."""

from __future__ import annotations

import pytest

from measure import tiers


def test_a_deadline_is_missed_by_an_answer_after_it_or_by_none() -> None:
    # within 144 s: 10 and 144 meet it, 144.5 and a missing answer do not
    assert tiers.deadline_misses([10.0, 144.0, 144.5, None], 144.0) == 2
    assert tiers.deadline_misses([], 144.0) == 0


def test_a_cost_per_1000_completed_requests() -> None:
    assert tiers.per_1k(0.45, 900) == pytest.approx(0.5)  # 0.45 / 900 x 1000
    assert tiers.per_1k(None, 900) is None and tiers.per_1k(0.45, 0) is None


def test_arms_are_compared_as_a_ratio_of_their_means() -> None:
    # (0.4 + 0.6) / 2 = 0.5 over (1.0 + 1.0) / 2 = 1.0
    assert tiers.ratio_of_means([(0.4, 1.0), (0.6, 1.0)]) == pytest.approx(0.5)
    assert tiers.ratio_of_means([(0.4, 1.0), (None, 1.0)]) is None
    assert tiers.ratio_of_means([]) is None
