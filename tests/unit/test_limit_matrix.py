"""The limit matrix's figures on cases whose answer is known by hand: a capacity in force over a
schedule, a limiter held at the service's limit, calls that spend part of each permit on the way."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.limit_matrix import UNTIL, drift, summary
from bench.limit_simulation import capacity, fixed, refused_share, simulate, used_share
from consumers.ai.limit import AdaptiveLimit


def held_at(level: int) -> Callable[[Callable[[], float]], AdaptiveLimit]:
    """A limiter that never moves from `level`, on the simulation's clock."""
    return lambda clock: AdaptiveLimit(initial=level, minimum=level, maximum=level, clock=clock)


def test_the_capacity_in_force_integrates_the_schedule_over_the_window() -> None:
    schedule = [(0.0, 64), (10.0, 32), (20.0, 64)]
    assert capacity(schedule, 5, 25) == 64 * 5 + 32 * 10 + 64 * 5  # 960 slot-seconds
    assert capacity(schedule, 12, 18) == 32 * 6
    assert capacity(schedule, 30, 40) == 64 * 10  # the last limit holds for ever


def test_a_drift_from_64_to_40_in_twelve_steps_averages_52() -> None:
    schedule = drift(64, 40, 12)
    assert [lim for _, lim in schedule] == list(range(64, 39, -2))
    # 13 levels of equal length, 64 down to 40: their mean is (64 + 40) / 2.
    assert capacity(schedule, 0, UNTIL) == pytest.approx(52 * UNTIL)


def test_a_limiter_held_at_the_service_limit_with_no_lag_uses_all_of_it_and_is_never_refused() -> None:
    # Each answer frees its place and the next call takes it in the same instant: 64 slots busy
    # from 0 to the end.
    run = simulate([(0.0, 64)], until=30, draw=fixed(1.0), lag=0.0, limiter=held_at(64))
    assert used_share(run["busy"], [(0.0, 64)], 0, 30) == pytest.approx(1.0)
    assert refused_share(run, 0) == 0.0
    assert run["refused"] == 0


def test_a_lag_each_way_idles_the_slot_for_its_round_trip() -> None:
    # Calls of exactly 1 s, 0.25 s each way: a permit lasts 1.5 s of which the service holds the
    # call 1 s (from 0.25, 1.75, ...): 10 s of each slot's 15, two thirds.
    run = simulate([(0.0, 64)], until=15, draw=lambda rng: 1.0, lag=0.25, jitter=0.0, limiter=held_at(64))
    assert used_share(run["busy"], [(0.0, 64)], 0, 15) == pytest.approx(2 / 3)
    assert refused_share(run, 0) == 0.0


def test_a_service_that_grows_is_measured_against_the_limit_of_each_moment() -> None:
    # 32 calls always busy; the service holds 32 for 10 s, then 64 for 10 s: 640 of 960 slot-seconds.
    schedule = [(0.0, 32), (10.0, 64)]
    run = simulate(schedule, until=20, draw=fixed(1.0), lag=0.0, limiter=held_at(32))
    assert used_share(run["busy"], schedule, 0, 20) == pytest.approx(2 / 3)
    assert refused_share(run, 0) == 0.0


def test_refusals_are_counted_against_the_calls_that_reached_the_service_from_the_start() -> None:
    run = {"refused_at": [1.0, 5.0, 6.0], "busy": [(0.0, 1.0), (4.0, 5.0), (5.0, 7.0), (6.0, 8.0)]}
    assert refused_share(run, 5.0) == 2 / 4  # from 5: refused at 5 and 6, served from 5 and 6
    assert refused_share(run, 10.0) == 0.0


def test_a_cell_holds_the_target_only_in_the_worst_of_its_seeds() -> None:
    cell = summary([(0.96, 0.005), (0.94, 0.002)])
    assert cell["worst"] == {"used": 0.94, "refused": 0.005}
    assert cell["mean"] == pytest.approx({"used": 0.95, "refused": 0.0035})
    assert not cell["holds"]  # 0.95 used on average, 0.94 in one seed
    assert summary([(0.95, 0.01)])["holds"]
    assert not summary([(0.99, 0.011)])["holds"]
