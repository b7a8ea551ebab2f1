"""The benchmark's estimators on hand-built completion series."""

import pytest

from bench.figures import skew, steady_rate


def waves(slots: int, period_s: float, count: int, spread_s: float = 0.05) -> list[float]:
    """`count` waves: `slots` calls that started together finishing within `spread_s`."""
    return [k * period_s + spread_s * j / slots for k in range(count) for j in range(slots)]


@pytest.mark.parametrize("offset", [0.0, 0.7, 1.9])
def test_steady_rate_of_waves_is_slots_over_period(offset: float) -> None:
    times = [t + offset for t in waves(64, 3.0, 20)]
    assert steady_rate(times) == pytest.approx(64 / 3.0, rel=0.02)


def test_steady_rate_ignores_ramp_and_tail() -> None:
    ramp = [i * 1.0 for i in range(10)]  # 1/s
    plateau = [10 + i * 0.05 for i in range(400)]  # 20/s
    tail = [30 + i * 2.0 for i in range(10)]  # 0.5/s
    assert steady_rate(ramp + plateau + tail) == pytest.approx(20.0, rel=0.01)


def test_steady_rate_needs_enough_points() -> None:
    assert steady_rate([1.0, 2.0, 3.0]) == 0.0


def test_skew_of_even_and_hot_partitions() -> None:
    assert skew([5, 5, 5, 5]) == (1.0, 0.0)
    max_over_mean, cv = skew([20, 0, 0, 0])
    assert max_over_mean == 4.0
    assert cv == pytest.approx(3 ** 0.5)
