"""Wilcoxon's signed-rank test (measure.signed_rank) against hand-computed ranks, variances,
Walsh averages and bounds."""

from __future__ import annotations

import pytest

from measure.signed_rank import signed_rank


def test_w_z_and_the_shift_of_pairs_with_a_zero_and_ties() -> None:
    # differences 2 -1 0 1 3 3: the zero is dropped, |d| of the other five 1 1 2 3 3 ranked
    # 1.5 1.5 3 4.5 4.5; W+ = 1.5 + 3 + 4.5 + 4.5 = 13.5 of mean 5 x 6 / 4 = 7.5; ties two pairs:
    # sigma^2 = 5 x 6 x 11 / 24 - 2 x 6 / 48 = 13.75 - 0.25 = 13.5, sigma 3.674235;
    # z = (13.5 - 7.5 - 0.5) / 3.674235 = 1.496910; tables: P(Z > 1.49) = 0.06811,
    # P(Z > 1.50) = 0.06681, so p = 0.06721.
    # Walsh averages of -1 0 1 2 3 3 (zero kept): 21 of them, sorted
    # -1 -0.5 0 0 0.5 0.5 1 1 1 1 1.5 1.5 1.5 2 2 2 2.5 2.5 3 3 3; the 11th, the median, is 1.5.
    test = signed_rank([10.0] * 6, [12.0, 9.0, 10.0, 11.0, 13.0, 13.0], confidence=0.95)
    assert (test.w, test.n, test.nonzero, test.observed) == (13.5, 6, 5, 6)
    assert test.z == pytest.approx(1.496910, abs=1e-6)
    assert test.p_greater == pytest.approx(0.06721, abs=5e-5)
    assert test.p_two_sided == pytest.approx(2 * 0.06721, abs=1e-4)
    assert test.shift == 1.5 and test.baseline_median == 10.0
    assert test.relative_shift == pytest.approx(0.15)
    # k = floor(21 / 2 - 1.644854 x sqrt(6 x 7 x 13 / 24) + 0.5) = floor(11 - 7.844) = 3:
    # the 3rd smallest (0) and the 3rd largest (3)
    assert (test.shift_low, test.shift_high) == (0.0, 3.0)


def test_bounds_of_ten_pairs_at_99_percent() -> None:
    # differences -7 -5 -3 -1 1 5 7 9 11 13 (symmetric about 3); k = floor(55 / 2 - 2.326348 x
    # sqrt(96.25) + 0.5) = floor(5.177) = 5. Smallest averages -7 -6 -5 -5 -4: the 5th is -4, and
    # by the symmetry the 5th largest is 3 + 7 = 10.
    differences = [-7.0, -5.0, -3.0, -1.0, 1.0, 5.0, 7.0, 9.0, 11.0, 13.0]
    test = signed_rank([0.0] * 10, differences)
    assert (test.shift, test.shift_low, test.shift_high) == (3.0, -4.0, 10.0)
    assert test.relative_shift is None  # a baseline median of 0 has no relative shift


def test_identical_and_reversed_pairs() -> None:
    same = signed_rank([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert (same.z, same.p_greater, same.p_two_sided, same.shift, same.nonzero) == (0.0, 1.0, 1.0, 0.0, 0)
    # every candidate faster: W+ = 0, z = -(6 x 7 / 4 - 0.5) / sqrt(6 x 7 x 13 / 24) = -10 / 4.769696
    faster = signed_rank([5.0, 6.0, 7.0, 8.0, 9.0, 10.0], [4.0, 4.0, 4.0, 4.0, 4.0, 4.0])
    assert faster.w == 0.0 and faster.z == pytest.approx(-2.096570, abs=1e-6)
    assert faster.p_greater > 0.98 and faster.shift < 0


def test_thinning_keeps_pairs_evenly_spaced_in_order() -> None:
    # 2001 pairs, the i-th differing by i % 2: thinned to 1001 at positions 0, 2, .., 2000, all
    # even, so every kept difference is 0
    test = signed_rank([0.0] * 2001, [float(i % 2) for i in range(2001)], cap=1001)
    assert (test.n, test.observed, test.nonzero, test.shift) == (1001, 2001, 0, 0.0)


@pytest.mark.parametrize(("baseline", "candidate", "confidence"), [
    ([1.0, 2.0], [1.0], 0.99), ([], [], 0.99), ([1.0], [2.0], 0.5), ([1.0], [2.0], 1.0)])
def test_refuses_what_is_no_paired_test(baseline: list[float], candidate: list[float],
                                        confidence: float) -> None:
    with pytest.raises(ValueError):
        signed_rank(baseline, candidate, confidence)
