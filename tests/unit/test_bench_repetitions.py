"""Repeated benchmark figures on values written out by hand: a figure's mean and 95 % interval,
a ratio taken repetition by repetition, a difference of points, and what one run cannot say.
t(0.975, 2 df) = 4.302653 (a t table's two-sided 95 % for three values)."""

from __future__ import annotations

import pytest

from bench.repetitions import comparisons, scenario_figures
from measure.repeated import repeated

T_2 = 4.302653


def runs() -> list[dict[str, dict]]:
    return [{"baseline": {"throughput_rps": 4.0, "utilization": 0.30, "binding_limit": "generate.concurrency",
                          "lost": 0, "steady": {"rate_rps": 1.0}},
             "flow": {"throughput_rps": 10.0, "utilization": 0.90},
             "durable": {"throughput_rps": 9.0, "utilization": 0.80}},
            {"baseline": {"throughput_rps": 5.0, "utilization": 0.40, "binding_limit": "generate.concurrency",
                          "lost": 0, "steady": {"rate_rps": 1.0}},
             "flow": {"throughput_rps": 10.0, "utilization": 0.90},
             "durable": {"throughput_rps": 9.0, "utilization": 0.85}},
            {"baseline": {"throughput_rps": 6.0, "utilization": 0.50, "binding_limit": "generate.concurrency",
                          "lost": 0, "steady": {"rate_rps": 1.0}},
             "flow": {"throughput_rps": 12.0, "utilization": 0.90},
             "durable": {"throughput_rps": 9.0, "utilization": 0.90}}]


def test_a_figure_over_three_repetitions_is_its_mean_with_the_t_interval() -> None:
    baseline = scenario_figures(runs())["baseline"]
    # 4, 5, 6: mean 5, sd 1, se 1 / sqrt(3) = 0.57735, margin 4.302653 x 0.57735 = 2.48414
    assert baseline["throughput_rps"]["mean"] == 5.0
    assert baseline["throughput_rps"]["low"] == pytest.approx(2.5159, abs=1e-4)
    assert baseline["throughput_rps"]["high"] == pytest.approx(7.4841, abs=1e-4)
    assert baseline["throughput_rps"]["values"] == [4.0, 5.0, 6.0] and baseline["throughput_rps"]["n"] == 3
    # a value that does not move has no spread: its bounds are the value
    assert (baseline["lost"]["low"], baseline["lost"]["high"]) == (0.0, 0.0)
    # numbers only: a name and a breakdown have no mean
    assert "binding_limit" not in baseline and "steady" not in baseline


def test_a_ratio_is_taken_within_each_repetition_then_averaged() -> None:
    found = comparisons(runs())["flow_over_baseline"]
    assert found is not None
    # 10 / 4, 10 / 5, 12 / 6 = 2.5, 2.0, 2.0: mean 2.16667; squares of the deviations 0.11111 +
    # 0.02778 + 0.02778 = 0.16667, variance 0.08333, se sqrt(0.08333 / 3) = 0.16667, margin 0.71711
    assert found["values"] == [2.5, 2.0, 2.0]
    assert found["mean"] == pytest.approx(2.167, abs=1e-3)
    assert found["low"] == pytest.approx(2.16667 - T_2 * 0.16667, abs=1e-3)
    assert found["high"] == pytest.approx(2.16667 + T_2 * 0.16667, abs=1e-3)
    assert found["within_noise"] is False  # 1 is under 1.450


def test_a_difference_of_shares_is_in_points_and_may_be_inside_the_noise() -> None:
    found = comparisons(runs())["durable_minus_flow_utilization_points"]
    assert found is not None
    # 80 - 90, 85 - 90, 90 - 90 = -10, -5, 0: mean -5, sd 5, se 2.88675, margin 12.42069
    assert found["values"] == [-10.0, -5.0, 0.0]
    assert (found["low"], found["high"]) == (pytest.approx(-17.421, abs=1e-3), pytest.approx(7.421, abs=1e-3))
    assert found["within_noise"] is True


def test_comparisons_need_both_scenarios_and_one_run_has_no_interval() -> None:
    found = comparisons(runs()[:1])
    assert found["tuned_over_baseline"] is None  # no tuned ran
    one = found["flow_over_baseline"]
    assert one is not None and one["values"] == [2.5] and one["low"] is None and one["within_noise"] is None
    assert repeated([3.0]).within_noise(3.0) is None


def test_a_repetition_without_a_scenario_leaves_it_out_of_that_comparison() -> None:
    partial = runs()
    del partial[1]["durable"]
    # durable / flow in the first and third repetitions only: 9 / 10 and 9 / 12
    found = comparisons(partial)["durable_over_flow"]
    assert found is not None and found["values"] == [0.9, 0.75]
    assert scenario_figures(partial)["durable"]["throughput_rps"]["n"] == 2
