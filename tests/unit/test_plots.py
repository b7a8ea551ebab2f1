"""What the plots draw (the tuning run's, the capacity search's, the benchmark's and the fault
run's), read back from their figures: the lines' points, the bars' heights, the shaded windows
and the titles, against data written here by hand."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import matplotlib.pyplot as plt
import pytest

from bench import fault_report
from bench import report as bench_report
from bench.fault_record import Injection, Load
from consumers.config import pipeline_spec
from consumers.runs.capacity_search import Step
from pipeline_ops import report
from tests.unit.test_faults import measured
from tests.unit.test_faults import phase as fault_phase

SPEC = pipeline_spec.load("genai_image")


class Hook:
    """PostgresHook's `get_records`, answering from rows keyed by a word of the query."""

    def __init__(self, completions: dict[str, list[float]],
                 partitions: dict[str, list[tuple[int, int]]]) -> None:
        self.completions, self.partitions = completions, partitions

    def get_records(self, sql: str, parameters: Any) -> list[tuple]:
        if "stage_results" in sql:
            return [(s,) for s in self.completions[parameters["run"]]]
        topic = parameters[0]
        return next(rows for run, rows in self.partitions.items() if topic.startswith(run))


@pytest.fixture(autouse=True)
def closed() -> Iterator[None]:
    yield
    plt.close("all")


def trial(run_id: str, utilization: float, skew: float) -> dict[str, Any]:
    return {"run_id": run_id, "utilization": utilization, "skew_max_over_mean": skew,
            "skew_diagnosis": "balanced"}


FIGURES = {"trials": [trial("tuning-x-v1-t1", 0.95, 1.2), trial("tuning-x-v1-t2", 0.9, 1.5)],
           "summary": {"capacity_rps": {"estimate": 2.0, "low": 1.9, "high": 2.1},
                       "utilization": {"estimate": 0.925, "low": 0.9, "high": 0.95}, "trials": 2}}
HOOK = Hook({"tuning-x-v1-t1": [0.5, 1.0, 2.5], "tuning-x-v1-t2": [1.0, 4.0]},
            {"tuning-x-v1-t1": [(0, 2), (1, 1)], "tuning-x-v1-t2": [(0, 1), (1, 1)]})


def test_completions_count_up_one_per_completion_against_the_capacity_line() -> None:
    (ax,) = report.completions_figure(FIGURES, SPEC, HOOK).axes
    first, second, capacity = ax.get_lines()
    assert (list(first.get_xdata()), list(first.get_ydata())) == ([0.5, 1.0, 2.5], [1, 2, 3])
    assert (list(second.get_xdata()), list(second.get_ydata())) == ([1.0, 4.0], [1, 2])
    # from 0 to the last completion (4 s) at 2 requests/s: 8 requests
    assert (list(capacity.get_xdata()), list(capacity.get_ydata())) == ([0, 4.0], [0, 8.0])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "t1: utilization 0.95", "t2: utilization 0.9", "AI capacity (2.0 rps)"]
    assert ax.get_ylabel() == "completed requests (generate results)"
    assert ax.get_title() == "utilization 0.925 [0.900, 0.950] over 2 trials"


def test_partitions_draw_a_bar_per_partition_for_each_trial() -> None:
    fig = report.partitions_figure(FIGURES, SPEC, HOOK)
    heights = [[bar.get_height() for bar in ax.patches] for ax in fig.axes]
    assert heights == [[2, 1], [1, 1]]
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        "tuning-x-v1-t1: max/mean 1.2, balanced", "tuning-x-v1-t2: max/mean 1.5, balanced"]
    assert fig.get_suptitle() == "requests per partition (style topic)"


def test_capacity_draws_each_step_s_lag_and_its_p99_against_the_objective() -> None:
    steps = [Step(9.0, True, 0.1, 0.3, lag=[(0.0, 5), (1.0, 3)]),
             Step(11.25, False, 4.0, None, lag=[(0.0, 5), (1.0, 9), (2.0, 14)])]
    result = {"objective": {"p99_s": 0.5}, "ai_capacity_rps": 10.0, "max_sustainable_rps": 9.0}
    lag_ax, p99_ax = report.capacity_figure(result, steps).axes
    held, failed = lag_ax.get_lines()
    assert (list(held.get_ydata()), held.get_linestyle()) == ([5, 3], "-")
    assert (list(failed.get_ydata()), failed.get_linestyle()) == ([5, 9, 14], ":")
    assert [t.get_text() for t in lag_ax.get_legend().get_texts()] == ["1: 9.0 rps held",
                                                                       "2: 11.2 rps failed"]
    (points,) = p99_ax.collections
    assert points.get_offsets().tolist() == [[9.0, 0.3], [11.25, 0.0]]  # no p99: drawn at 0
    objective, capacity = p99_ax.get_lines()
    assert list(objective.get_ydata()) == [0.5, 0.5] and list(capacity.get_xdata()) == [10.0, 10.0]
    assert p99_ax.get_title() == "max sustainable 9.0 rps"


def test_the_benchmark_s_completions_are_cumulative_per_second_against_the_capacity_line() -> None:
    # flow completes 2, 3, 0 and 5 in its first four seconds, tuned 1 and 1; a second
    # repetition of flow completes 4 in its first second
    first = {"flow": [100.1, 100.2, 101.1, 101.2, 101.3, *[103.5] * 5], "tuned": [50.5, 51.5]}
    series, starts = [first, {"flow": [200.5] * 4}], [{"flow": 100.0, "tuned": 50.0}, {"flow": 200.0}]
    (ax,) = bench_report.completions_figure(series, starts, 2.5).axes
    flow, tuned, flow_again, capacity = ax.get_lines()
    assert (list(flow.get_xdata()), list(flow.get_ydata())) == ([1, 2, 3, 4], [2, 5, 5, 10])
    assert list(tuned.get_ydata()) == [1, 2]
    assert list(flow_again.get_ydata()) == [4]
    assert flow_again.get_color() == flow.get_color() != tuned.get_color()
    assert (list(capacity.get_xdata()), list(capacity.get_ydata())) == ([0, 4], [0, 10.0])  # 4 s at 2.5/s
    assert ax.get_ylim() == pytest.approx((0, 10.5))  # 1.05 x the most completed
    # one legend entry per scenario, not per repetition
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["flow", "tuned", "AI capacity (2.5 rps)"]


def test_the_benchmark_s_ratios_draw_each_interval_its_repetitions_and_its_mean() -> None:
    ratios = {"flow_over_baseline": {"mean": 2.2, "low": 1.5, "high": 2.9, "values": [2.5, 2.0, 2.1]},
              "share_over_flow": None,  # not run: not drawn
              "durable_minus_flow_utilization_points": {"mean": -5.0, "low": -17.0, "high": 7.0,
                                                        "values": [-10.0, -5.0, 0.0]}}
    (ax,) = bench_report.ratios_figure(ratios).axes
    band, dots, mean, points_band, points_dots, points_mean, none = ax.get_lines()
    assert (list(band.get_xdata()), list(band.get_ydata())) == ([1.5, 2.9], [0, 0])
    assert list(dots.get_xdata()) == [2.5, 2.0, 2.1] and list(mean.get_xdata()) == [2.2]
    # -17 and +7 points drawn as 1 - 0.17 and 1 + 0.07 on the ratios' axis, at the second row
    assert list(points_band.get_xdata()) == pytest.approx([0.83, 1.07])
    assert list(points_band.get_ydata()) == [1, 1]
    assert list(points_dots.get_xdata()) == pytest.approx([0.9, 0.95, 1.0])
    assert list(points_mean.get_xdata()) == pytest.approx([0.95])
    assert list(none.get_xdata()) == [1.0, 1.0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["flow over baseline",
                                                             "durable minus flow utilization points"]


def test_the_benchmark_s_partitions_draw_each_scenario_s_bars() -> None:
    fig = bench_report.partitions_figure({"flow": [3, 0, 2], "tuned": [1, 4, 0]})
    assert [[bar.get_height() for bar in ax.patches] for ax in fig.axes] == [[3, 0, 2], [1, 4, 0]]
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["flow", "tuned"]


def test_a_fault_s_panel_shades_its_window_and_marks_the_recovery() -> None:
    counts = [18] * 20 + [0] * 30 + [21] * 25
    phase = fault_phase(fault="broker-kill", load=Load(100.0, 175.0, 1408), injection=Injection(120.0, 150.0),
                        figures=measured(recovery_s=3, pre_fault_rps=18.0, completions_per_second=counts))
    failed = replace(phase, fault="oversize", failures=["1 lost"], figures=replace(phase.figures, lost=1))
    fig = fault_report.figure([phase, failed, phase], 18.8)
    first, second, _, empty = fig.axes
    assert first.get_title(loc="left") == "broker-kill: pass, lost 0, recovered in 3 s"
    assert second.get_title(loc="left") == "oversize: FAIL, lost 1, recovered in 3 s"
    assert not empty.axison  # three phases on a grid of two columns: the fourth panel is off
    (window,) = first.patches  # the fault, 20 s to 50 s after the load started
    assert window.get_x() == pytest.approx(20.0) and window.get_width() == pytest.approx(30.0)
    rate, load, recovered, pre_fault, threshold = first.get_lines()
    assert list(rate.get_ydata()) == counts
    assert list(load.get_ydata()) == [18.8, 18.8]
    assert list(recovered.get_xdata()) == [53.0, 53.0]  # the fault's end + 3 s
    assert list(pre_fault.get_ydata()) == [18.0, 18.0]
    assert list(threshold.get_ydata()) == pytest.approx([16.2, 16.2])  # 0.9 of the pre-fault 18
    assert fig.get_suptitle() == "Completions per second under each fault"


def test_the_adaptive_run_s_limits_and_rate_against_the_capacity_in_force() -> None:
    # calls of 1 s; the service's limit 4, cut to 2 at 1 s; the fleet found 3 at 0.2 s;
    # four completions at 0.5, 1.0, 1.5 and 2.0 s after the first produce
    scenario = {"first_produced_s": 100.0,
                "adaptive": {"service_s": 1.0, "stage": "generate", "service_limits": [(-1.0, 4), (1.0, 2)],
                             "discovered_limits": [(0.2, 3)]}}
    limits, rates = bench_report.adaptive_figure("flow-adaptive", scenario, [101.5, 100.5, 102.0, 101.0]).axes
    service, discovered = limits.get_lines()
    assert (list(service.get_xdata()), list(service.get_ydata())) == ([0.0, 1.0, 2.0], [4, 2, 2])
    assert (list(discovered.get_xdata()), list(discovered.get_ydata())) == ([0.2, 2.0], [3, 3])
    assert limits.get_title() == "flow-adaptive: generate concurrency limit"
    rate, capacity = rates.get_lines()
    # completions in the second before each quarter second
    assert list(rate.get_xdata()) == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    assert list(rate.get_ydata()) == [0, 1, 1, 2, 2, 2, 2, 2]
    assert list(capacity.get_ydata()) == [4, 2, 2]  # the limit over 1 s calls, per second
