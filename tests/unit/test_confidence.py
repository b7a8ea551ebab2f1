"""Confidence bounds (measure.confidence) against hand-computed t-interval numbers."""

from __future__ import annotations

import math

import pytest

from measure.confidence import difference_bounds, mean_bounds, t_cdf, t_quantile


@pytest.mark.parametrize(("p", "df", "expected"), [
    (0.95, 1, 6.313752), (0.95, 2, 2.919986), (0.95, 4, 2.131847), (0.975, 10, 2.228139),
    (0.95, 30, 1.697261), (0.95, 1e7, 1.644854),  # the normal quantile in the limit
])
def test_t_quantile_matches_the_tables(p: float, df: float, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-5)


def test_t_cdf_is_symmetric_and_exact_for_one_degree_of_freedom() -> None:
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert t_cdf(-2.0, 5) == pytest.approx(1 - t_cdf(2.0, 5))


def test_t_quantile_refuses_what_it_cannot_answer() -> None:
    with pytest.raises(ValueError):
        t_quantile(0.4, 3)
    with pytest.raises(ValueError):
        t_quantile(0.95, 0)


def test_mean_bounds_of_three_trials() -> None:
    # mean 0.95, sd 0.02, se 0.02 / sqrt(3) = 0.0115470, t(0.95, 2) = 2.919986: margin 0.0337171
    interval = mean_bounds([0.93, 0.95, 0.97])
    assert interval.estimate == pytest.approx(0.95)
    assert interval.low == pytest.approx(0.9162829, abs=1e-6)
    assert interval.high == pytest.approx(0.9837171, abs=1e-6)
    assert (interval.df, interval.n, interval.confidence) == (2, (3,), 0.95)
    assert interval.as_dict() == {"estimate": 0.95, "low": 0.9163, "high": 0.9837, "confidence": 0.95,
                                  "df": 2, "n": [3]}


def test_mean_bounds_without_variation_are_the_mean() -> None:
    interval = mean_bounds([0.9, 0.9, 0.9])
    assert (interval.low, interval.high, interval.df) == (pytest.approx(0.9), pytest.approx(0.9), None)


def test_mean_bounds_need_two_trials() -> None:
    with pytest.raises(ValueError, match="at least 2 trials"):
        mean_bounds([0.9])


def test_welch_difference_with_equal_variances() -> None:
    # means 11 and 13, variances 1 and 1: se = sqrt(1/3 + 1/3) = 0.816497
    # df = (2/3)^2 / ((1/3)^2 / 2 + (1/3)^2 / 2) = 4
    interval = difference_bounds([10.0, 11.0, 12.0], [12.0, 13.0, 14.0])
    assert (interval.estimate, interval.df, interval.n) == (-2.0, pytest.approx(4.0), (3, 3))
    margin = 2.131847 * math.sqrt(2 / 3)  # 1.740646
    assert interval.low == pytest.approx(-2 - margin, abs=1e-5)
    assert interval.high == pytest.approx(-2 + margin, abs=1e-5)


def test_welch_degrees_of_freedom_with_unequal_variances() -> None:
    # a: var 1 over 3 -> 1/3; b = 0, 4, 8, 12: mean 6, var 80/3 over 4 -> 20/3; se = sqrt(7)
    # df = 49 / ((1/3)^2 / 2 + (20/3)^2 / 3) = 49 / (1/18 + 400/27) = 3.295143
    # t(0.95, 3.295143) = 2.269867 (Simpson's rule over the t density from 0, solved for 0.45):
    # low = -4 - 2.269867 x 2.645751 = -10.005505
    interval = difference_bounds([1.0, 2.0, 3.0], [0.0, 4.0, 8.0, 12.0])
    assert interval.df == pytest.approx(3.295143, abs=1e-5)
    assert interval.estimate == -4.0
    assert interval.low == pytest.approx(-10.005505, abs=1e-5)
    assert interval.high == pytest.approx(2.005505, abs=1e-5)
    assert 2.132 < t_quantile(0.95, interval.df) < 2.353  # between the df 4 and df 3 table values


def test_difference_bounds_need_two_trials_per_side() -> None:
    with pytest.raises(ValueError, match="per side"):
        difference_bounds([1.0, 2.0], [3.0])
