"""The capacity search's decision and bisection (consumers.runs.capacity_search) on a simulated pipeline."""

from __future__ import annotations

import pytest

from consumers.runs.capacity_search import Objective, Step, search, sustained

OBJECTIVE = Objective(p99_s=1.5, lag_growth=0.02, step_s=20, precision=0.03, max_steps=8)


def pipeline_with_limit(limit: float, log: list[float]):
    """A simulated pipeline that sustains every rate up to `limit`."""
    def measure(rate: float) -> Step:
        log.append(rate)
        return Step(rate, rate <= limit, 0.0 if rate <= limit else rate - limit, 0.5)
    return measure


def test_search_steps_up_then_bisects_to_the_limit() -> None:
    rates: list[float] = []
    best, steps = search(pipeline_with_limit(50.0, rates), 45.0, OBJECTIVE)
    # 45 holds -> x1.25 = 56.25 fails -> bisect: 50.625 fails, 47.8125 holds, 49.21875 holds;
    # the bracket [49.22, 50.63] is 1.41 wide, within 3% of 50.63 (1.52): stop
    assert rates == [45.0, 56.25, 50.625, 47.8125, 49.21875]
    assert best == 49.21875 and [s.sustained for s in steps] == [True, False, False, True, True]


def test_search_steps_down_from_a_start_above_the_limit() -> None:
    rates: list[float] = []
    best, _ = search(pipeline_with_limit(50.0, rates), 60.0, OBJECTIVE)
    # 60 fails -> x0.8 = 48 holds -> 54 fails, 51 fails, 49.5 holds; [49.5, 51] is within 1.53
    assert rates == [60.0, 48.0, 54.0, 51.0, 49.5]
    assert best == 49.5


def test_search_stops_after_max_steps() -> None:
    rates: list[float] = []
    best, _ = search(pipeline_with_limit(50.0, rates), 45.0,
                     Objective(p99_s=1.5, max_steps=3))
    assert rates == [45.0, 56.25, 50.625] and best == 45.0


def test_search_reports_none_when_nothing_holds() -> None:
    rates: list[float] = []
    best, _ = search(pipeline_with_limit(0.0, rates), 10.0, Objective(p99_s=1.5, max_steps=3))
    assert rates == [10.0, 8.0, pytest.approx(6.4)] and best is None


def test_a_step_is_sustained_up_to_each_bound_inclusive() -> None:
    # lag may grow by at most 2% of the rate: 1.0 records/s at 50 rps
    assert sustained(50.0, 1.0, 1.5, 0, OBJECTIVE)
    assert not sustained(50.0, 1.01, 1.5, 0, OBJECTIVE)
    assert not sustained(50.0, 0.0, 1.51, 0, OBJECTIVE)
    assert not sustained(50.0, 0.0, None, 0, OBJECTIVE)  # nothing completed
    assert not sustained(50.0, 0.0, 0.4, 1, OBJECTIVE)  # a request lost


@pytest.mark.parametrize(("fields", "message"), [
    ({"p99_s": 0}, "must be positive"), ({"p99_s": 1, "step_s": 0}, "must be positive"),
    ({"p99_s": 1, "lag_growth": 1.0}, "lag_growth"), ({"p99_s": 1, "precision": 0}, "precision"),
    ({"p99_s": 1, "max_steps": 1}, "at least 2 steps"),
])
def test_objective_refuses_settings_that_cannot_decide(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Objective(**fields)


def test_step_summary_keeps_the_figures_that_matter() -> None:
    step = Step(40.0, True, 0.1, 0.6, {"steady_throughput_rps": 39.5, "capacity_rps": 41.0,
                                       "utilization": 0.96, "lost": 0, "p50_ms": 300.0},
                [(0.0, 3), (1.0, 12), (2.0, 9)])
    assert step.summary() == {"rate": 40.0, "sustained": True, "lag_trend": 0.1, "p99_s": 0.6, "lag_max": 12,
                              "steady_throughput_rps": 39.5, "capacity_rps": 41.0, "utilization": 0.96,
                              "lost": 0}
