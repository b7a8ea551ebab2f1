"""The benchmark's smoke run: its output is complete and consistent, and its figures can be
recomputed from the database rows (never a check of timings)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from bench import run as bench_run
from infra import spark_connect
from tests.integration.pipeline_fixtures import ai_service, query, scalar
from tests.png import drawn
from tests.stack import Stack

# The benchmark reconfigures and resets a stand-in of its own, and checks the stack's Spark
# master: alone on it for the whole module (the smoke run included); its timeout counts a wait
# for the Spark cluster test's jobs to end.
pytestmark = [pytest.mark.usefixtures("spark_master_for_module"), pytest.mark.timeout(1200)]

SCENARIO_FIELDS = {"throughput_rps", "steady_throughput_rps", "capacity_rps", "binding_limit", "utilization",
                   "lost", "duplicate_ai_calls",
                   "rebalances", "skew_max_over_mean", "skew_cv", "p50_ms", "p95_ms", "p99_ms",
                   "overhead_p99_ms", "refetch_amplification"}


@pytest.fixture(scope="module")
def smoke(stack: Stack) -> Iterator[tuple[Path, dict]]:
    """The smoke run on the stack, its AI endpoints on a stand-in of its own (AI_SERVICE_URL,
    which the benchmark and its fleets' processes read), so that it holds no other test's."""
    with ai_service() as ai, pytest.MonkeyPatch.context() as env:
        env.setenv("AI_SERVICE_URL", ai.base_url)
        out = bench_run.main(["--smoke"])
    yield out, json.loads((out / "summary.json").read_text())


def test_summary_has_every_field(smoke: tuple[Path, dict]) -> None:
    _, summary = smoke
    assert {"run_id", "time_scale", "ai_capacity_rps", "versions", "params", "repeat", "repetitions",
            "scenarios", "ratios", "producer_vs_perftest", "pause_benchmark"} <= set(summary)
    assert summary["versions"]["confluent_kafka"] == metadata.version("confluent-kafka")
    assert summary["versions"]["pyspark"] == metadata.version("pyspark")
    assert set(summary["scenarios"]) == set(bench_run.SCENARIOS)
    (run,) = summary["repetitions"]  # the smoke run repeats nothing
    assert summary["repeat"] == 1 and set(run) == set(bench_run.SCENARIOS)
    for name, figures in run.items():
        assert set(figures) >= SCENARIO_FIELDS, (name, SCENARIO_FIELDS - set(figures))
        assert figures["run_id"].endswith(f"-{name}-1")
        assert {"cpu_busy_pct", "late_wakeups", "probe_wakeups"} <= set(figures["machine"]), name
        # the burst kept the brokers and the pipeline's own processes busy, each seen by its role
        assert figures["cpu_s"].get("brokers", 0) > 0 and figures["cpu_s"].get("pipeline", 0) > 0, name
        # one repetition: each number its own mean, with no interval to give
        repeated = summary["scenarios"][name]
        assert repeated["throughput_rps"] == {"mean": figures["throughput_rps"], "low": None, "high": None,
                                              "n": 1, "values": [figures["throughput_rps"]]}, name
        assert "binding_limit" not in repeated and set(repeated) >= SCENARIO_FIELDS - {"binding_limit"}
    flow_over_baseline = run["flow"]["throughput_rps"] / run["baseline"]["throughput_rps"]
    assert summary["ratios"]["flow_over_baseline"]["mean"] == pytest.approx(flow_over_baseline, abs=1e-3)
    assert summary["ratios"]["flow_over_baseline"]["within_noise"] is None
    assert {"project_records_per_s", "perftest_records_per_s", "ratio", "mb_per_s_per_partition"} <= set(
        summary["producer_vs_perftest"])
    assert {"naive_records", "flow_records", "naive_fetch_amplification",
            "flow_fetch_amplification"} <= set(summary["pause_benchmark"])


def test_the_steady_phase_says_how_busy_the_machine_was(smoke: tuple[Path, dict]) -> None:
    _, summary = smoke
    steady = summary["repetitions"][0]["flow"]["steady"]
    assert steady["lost"] == 0 and steady["overhead_p99_ms"] > 0
    # the probe slept 5 ms at a time for the whole phase, which lasts seconds even in a smoke run
    assert steady["probe_wakeups"] >= 100, steady
    assert 0 <= steady["late_wakeups"] <= steady["probe_wakeups"]
    assert 0 < steady["cpu_busy_pct"] <= 100 and steady["cpu_steal_pct"] >= 0


def test_counts_add_up(smoke: tuple[Path, dict]) -> None:
    _, summary = smoke
    burst = summary["params"]["burst"]
    for name, s in summary["repetitions"][0].items():
        terminal = sum(s["status"].get(k, 0) for k in ("completed", "rejected", "dead_lettered"))
        assert s["produced"] == burst == terminal + s["lost"], name
        assert sum(s["requests_per_partition"]) == burst, name
        assert len(s["requests_per_partition"]) == summary["params"]["partitions"], name


def test_figures_recomputed_from_the_database(stack: Stack, smoke: tuple[Path, dict]) -> None:
    _, summary = smoke
    db = stack.database_url
    for name, s in summary["repetitions"][0].items():
        run = s["run_id"]
        # measure/figures.py: completed / (last terminal state - first produce); nothing is rejected
        # or dead-lettered here, so the last terminal state is the last completion
        done, span = query(db, "SELECT count(*) FILTER (WHERE status = 'completed'), extract(epoch FROM "
                           "max(finished_at) - min(produced_at)) FROM requests WHERE run_id = %s", run)[0]
        assert s["completed"] == done, name
        assert s["throughput_rps"] == pytest.approx(done / float(span), abs=0.001)
        terminal = scalar(db, "SELECT count(*) FROM requests WHERE run_id = %s AND status IN "
                          "('completed', 'rejected', 'dead_lettered')", run)
        assert s["lost"] == s["produced"] - terminal
        calls = query(db, "SELECT request_id, stage, count(*) FROM ai_attempts WHERE run_id = %s "
                      "AND outcome IN ('ok', 'started') GROUP BY 1, 2", run)
        assert s["duplicate_ai_calls"] == sum(n - 1 for _, _, n in calls)
        p99 = scalar(db, "SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM "
                     "notified_at - produced_at)) FROM requests WHERE run_id = %s "
                     "AND status = 'completed'", run)
        assert s["p99_ms"] == pytest.approx(float(p99) * 1000, abs=0.1)
        mean_generate = scalar(db, "SELECT avg(extract(epoch FROM ended_at - started_at)) FROM ai_attempts "
                               "WHERE run_id = %s AND stage = 'generate' AND outcome = 'ok'", run)
        capacity = summary["params"]["concurrency"] / float(mean_generate)
        assert s["capacity_rps"] == pytest.approx(capacity, abs=0.001), name
        assert s["binding_limit"] == "generate.concurrency", name
        # utilization: generate's call-seconds inside the steady band (the 20th to the 80th
        # percentile completion) over the slot-seconds the concurrency gives it
        times = sorted(float(t) for (t,) in query(
            db, "SELECT extract(epoch FROM completed_at) FROM stage_results WHERE run_id = %s "
            "AND stage = 'generate'", run))
        lo, hi = times[round(0.2 * (len(times) - 1))], times[round(0.8 * (len(times) - 1))]
        busy = scalar(db, "SELECT sum(greatest(0, least(extract(epoch FROM ended_at), %s) - "
                      "greatest(extract(epoch FROM started_at), %s))) FROM ai_attempts WHERE run_id = %s "
                      "AND stage = 'generate' AND outcome = 'ok'", hi, lo, run)
        used = float(busy) / (summary["params"]["concurrency"] * (hi - lo))
        assert s["utilization"] == pytest.approx(used, abs=0.001), name
        assert s["utilization"] <= 1.0, name
        per_partition: dict[tuple[str, int], list[float]] = {}
        for stage, partition, seconds in query(
                db, "SELECT stage, kafka_partition, extract(epoch FROM ended_at - started_at) "
                "FROM ai_attempts WHERE run_id = %s AND outcome = 'ok'", run):
            per_partition.setdefault((stage, partition), []).append(float(seconds))
        for stage, busiest in s["busiest_partition"].items():
            ai_s = max(sum(v) for (st, _), v in per_partition.items() if st == stage)
            assert busiest["ai_s"] == pytest.approx(ai_s, abs=1e-3), (name, stage)
            assert busiest["requests"] == len(per_partition[(stage, busiest["partition"])]), (name, stage)


def test_csv_and_plots_match_the_summary(smoke: tuple[Path, dict]) -> None:
    out, summary = smoke
    with open(out / "completions_per_second.csv") as handle:
        rows = list(csv.DictReader(handle))
    for name, s in summary["repetitions"][0].items():
        assert sum(int(r[f"{name}-1"]) for r in rows) == s["completed"], name
    # 9 inches at 110 dpi, each scenario's line or bars drawn (a line is hundreds of pixels)
    for plot in ("completions.png", "requests_per_partition.png"):
        width, _, series = drawn(out / plot)
        assert width == 990 and series > 200, (plot, width, series)
    assert drawn(out / "ratios.png")[0] == 990  # one repetition: its dots and means, no interval
    assert (out.parent / "latest").resolve() == out.resolve()


def test_the_spark_measurement_leaves_no_application_on_the_master(stack: Stack,
                                                                   smoke: tuple[Path, dict]) -> None:
    # A session kept open by the benchmark's process would hold the worker's cores, and every
    # later job submitted to the master (the DAGs' analysis) would wait for them. The stack's
    # Connect server is an application of the master for good; its idle executors are released.
    _, summary = smoke
    spark = summary["spark_partition_load"]
    assert spark["master"] == f"spark://127.0.0.1:{stack.layout.spark_master_port}", spark["master"]
    status = stack.spark_master_status()
    assert any(app["name"] == bench_run.spark_partition_load.APP_NAME for app in status["completedapps"])
    assert [app["name"] for app in status["activeapps"] if app["name"] != spark_connect.APP_NAME] == []
