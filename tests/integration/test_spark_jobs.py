"""The analysis jobs against the real stack: counts known from the generator, figures from SQL."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import psycopg2
import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from bench import figures as bench_figures
from consumers.config import pipeline_spec
from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.config.events import Topics
from consumers.config.kafka_connection import KafkaConnection
from consumers.loadgen import datagen
from consumers.runs.pipeline_run import running_pipeline
from consumers.runs.run_figures import standard_figures
from measure import figures as measure_figures
from spark import job_io, partition_load, pipeline_analysis
from spark.session import build
from tests.integration.pipeline_fixtures import TIME_SCALE, ai_service, scalar
from tests.stack import REPO, Stack, unique

PARTITIONS = 6
SKEW = "weights:1,1,1,5,1,0"  # partition 3 hot, partition 5 never written
RECORD_SIZE = 100


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = build("integration-jobs", "local[2]")
    yield session
    session.stop()


def watermarks(kafka: KafkaConnection, topic: str) -> dict[int, int]:
    """Records per partition as the broker reports them (log end - log start)."""
    consumer = Consumer(kafka.client(**{"group.id": unique("watermarks")}))
    try:
        marks = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                 for p in range(PARTITIONS)]
        return {p: high - low for p, (low, high) in enumerate(marks)}
    finally:
        consumer.close()


def gini(values: list[int]) -> float:
    """Mean absolute difference over twice the mean: the textbook definition, not the job's formula."""
    n, total = len(values), sum(values)
    return sum(abs(a - b) for a in values for b in values) / (2 * n * total)


@pytest.fixture(scope="module")
def skewed_topic(stack: Stack) -> tuple[str, dict[int, int], dict[int, int], int]:
    """A topic written in two batches: a skewed one, then a uniform one after a time boundary."""
    topic = unique("spark-load")
    first = datagen.generate(stack.connection, topic, 3000, skew=SKEW, partitions=PARTITIONS,
                             record_size=RECORD_SIZE, progress=False)
    time.sleep(0.2)
    boundary_ms = int(time.time() * 1000)
    time.sleep(0.2)
    second = datagen.generate(stack.connection, topic, 600, skew="uniform", record_size=RECORD_SIZE,
                              progress=False)
    return topic, first, second, boundary_ms


def test_datagen_counts_are_what_the_broker_holds(stack: Stack, skewed_topic) -> None:
    topic, first, second, _ = skewed_topic
    assert sum(first.values()) == 3000 and sum(second.values()) == 600
    assert max(first, key=first.get) == 3 and first[5] == 0
    assert watermarks(stack.connection, topic) == {p: first[p] + second[p] for p in range(PARTITIONS)}


def test_partition_load_through_spark_submit(stack: Stack, skewed_topic, tmp_path: Path) -> None:
    topic, first, second, _ = skewed_topic
    expected = {p: first[p] + second[p] for p in range(PARTITIONS)}
    run_id, output = unique("load-run"), tmp_path / "load.json"
    env = {k: v for k, v in stack.subprocess_env().items() if k != "PYTHONPATH"}  # the script finds the repo
    env["PYSPARK_PYTHON"] = sys.executable
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
           "--jars", stack.env["SPARK_JARS"], str(REPO / "spark" / "partition_load.py"),
           "--topics", topic, "--run-id", run_id, "--output-json", str(output), "--hot-threshold", "2.0",
           "--distinct-keys"]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]

    document = json.loads(output.read_text())
    rows = {p["partition"]: p for p in document["partitions"]}
    assert {p: r["records"] for p, r in rows.items()} == expected
    record_bytes = RECORD_SIZE + 16  # value plus a 16-byte key
    assert {p: r["bytes"] for p, r in rows.items()} == {p: n * record_bytes for p, n in expected.items()}
    # A random 16-byte key each. The sketch keys its coupons by a 26-bit slot, and two of a
    # partition's keys share one in about 2 % of runs (n^2 / 2^27 = 2.3 % for the hot partition's
    # n = 1,767): that partition's estimate is then one short.
    assert all(0 <= expected[p] - r["distinct_keys"] <= 1 for p, r in rows.items())
    assert [p for p, r in rows.items() if r["hot"]] == [3]

    (skew,) = document["skew"]
    counts = [expected[p] for p in range(PARTITIONS)]
    mean = sum(counts) / PARTITIONS
    assert (skew["records"], skew["partitions"], skew["hottest_partition"], skew["hot_partitions"]) == (
        3600, PARTITIONS, 3, [3])
    assert skew["max_over_mean"] == pytest.approx(max(counts) / mean)
    assert skew["hottest_share"] == pytest.approx(max(counts) / 3600)
    assert skew["gini"] == pytest.approx(gini(counts))
    assert skew["cv"] == pytest.approx((sum((c - mean) ** 2 for c in counts) / PARTITIONS) ** 0.5 / mean)
    assert sum(b["records"] for b in document["buckets"]) == 3600

    with psycopg2.connect(stack.database_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT kafka_partition, records, hot FROM analysis_partition_load "
                    "WHERE run_id = %s AND topic = %s", (run_id, topic))
        stored = {p: (n, hot) for p, n, hot in cur.fetchall()}
        cur.execute("SELECT records, hottest_partition, hot_partitions, gini FROM analysis_skew "
                    "WHERE run_id = %s AND topic = %s", (run_id, topic))
        stored_skew = cur.fetchone()
        cur.execute("SELECT kafka_partition, sum(records) FROM analysis_partition_buckets "
                    "WHERE run_id = %s GROUP BY 1", (run_id,))
        stored_buckets = dict(cur.fetchall())
        for table in ("analysis_partition_load", "analysis_skew", "analysis_partition_buckets"):
            cur.execute(f"DELETE FROM {table} WHERE run_id = %s", (run_id,))
    conn.close()
    assert stored == {p: (n, p == 3) for p, n in expected.items()}
    assert stored_skew[:3] == (3600, 3, [3]) and stored_skew[3] == pytest.approx(gini(counts))
    assert stored_buckets == {p: n for p, n in expected.items() if n}


def test_partition_load_time_window(stack: Stack, spark: SparkSession, skewed_topic) -> None:
    topic, _, second, boundary_ms = skewed_topic
    records = partition_load.read_records(spark, stack.connection, [topic], start_ms=boundary_ms)
    result = partition_load.analyse(records, {topic: PARTITIONS})
    assert {p["partition"]: p["records"] for p in result.partitions} == second
    before = partition_load.read_records(spark, stack.connection, [topic], end_ms=boundary_ms)
    assert before.count() == 3000


def test_kafka_is_read_through_the_v2_source(stack: Stack, spark: SparkSession, skewed_topic) -> None:
    """The session takes the connector's V2 source (spark/session.py); the V1 one converts every
    record to an external row and back."""
    topic = skewed_topic[0]
    plan = partition_load.read_records(spark, stack.connection, [topic])._jdf.queryExecution()
    physical = plan.executedPlan().toString()
    assert "BatchScan" in physical and "KafkaRelation" not in physical, physical


def broker_connections(pid: int, ports: set[int]) -> int:
    """The process's established TCP connections to the brokers."""
    return sum(1 for c in psutil.Process(pid).net_connections(kind="tcp")
               if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port in ports)


def settled_connections(pid: int, ports: set[int], quiet: float = 3.0, limit: float = 30.0) -> int:
    """The broker connections once their count has held for `quiet` seconds: an earlier test's
    pooled consumers are still being evicted when the next test starts, and a baseline taken
    among them falls while the scan's consumers come."""
    count, since, deadline = broker_connections(pid, ports), time.monotonic(), time.monotonic() + limit
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.2)
        now = broker_connections(pid, ports)
        if now != count:
            count, since = now, time.monotonic()
    return count


def test_a_scan_leaves_no_consumer_connected(stack: Stack, spark: SparkSession, skewed_topic) -> None:
    """The connector pools each task's consumer for a later task of its group, which a batch query
    never has (spark/session.py): the scan's consumers must close within seconds, not the
    connector's default 5 minutes. A sampler running through the scan shows they were there."""
    topic = skewed_topic[0]
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    ports = {int(address.rsplit(":", 1)[1]) for address in stack.connection.bootstrap.split(",")}
    before = settled_connections(pid, ports)
    peak, scanning = [before], threading.Event()

    def sample() -> None:
        while scanning.is_set():
            peak.append(broker_connections(pid, ports))
            time.sleep(0.01)

    scanning.set()
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        partition_load.analyse(partition_load.read_records(spark, stack.connection, [topic]),
                               {topic: PARTITIONS})
    finally:
        scanning.clear()
        sampler.join()
    assert max(peak) >= before + PARTITIONS, f"the scan's consumers never showed: {before} -> {max(peak)}"
    deadline = time.monotonic() + 15
    while broker_connections(pid, ports) > before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert broker_connections(pid, ports) <= before


# --- pipeline analysis ------------------------------------------------------------------------

BASE = datetime(2030, 1, 1, tzinfo=UTC)
PIPELINE = pipeline_spec.REFERENCE
ENTRIES = len(pipeline_spec.load(PIPELINE).entry_stages)  # both entry stages took every request


def at(seconds: float | None) -> datetime | None:
    return None if seconds is None else BASE + timedelta(microseconds=round(seconds * 1_000_000))


def insert_run(cur, run_id: str) -> None:
    """A synthetic run with rejections, missing notifications, retries, duplicates and rebalances."""
    rng = random.Random(11)
    members = ["m0", "m1", "m2"]
    for i in range(40):
        rid, member = f"{run_id}-r{i}", members[i % 3]
        produced = rng.uniform(0, 5)
        checked = produced + rng.uniform(0.2, 1.0)
        rejected = i % 10 == 9
        generated = None if rejected else checked + rng.uniform(1.5, 4.5)
        notified = None if generated is None or i % 7 == 0 else generated + rng.uniform(0.01, 0.2)
        status = "rejected" if rejected else "completed"
        finished = checked if rejected else generated
        cur.execute("INSERT INTO requests (pipeline, request_id, run_id, fields, status, entries, "
                    "produced_at, finished_at, notified_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (PIPELINE, rid, run_id, json.dumps({"user_id": "u", "object_id": "o"}), status, ENTRIES,
                     at(produced), at(finished), at(notified)))
        stages = [("check", produced, checked, "rejected" if rejected else "ok")]
        if generated is not None:
            stages.append(("generate", checked, generated, "ok"))
        for offset, (stage, start, end, outcome) in enumerate(stages):
            cur.execute("INSERT INTO stage_results (pipeline, request_id, stage, run_id, outcome, member, "
                        "topic, kafka_partition, kafka_offset, completed_at) "
                        "VALUES (%s, %s, %s, %s, %s, %s, 't', 0, %s, %s)",
                        (PIPELINE, rid, stage, run_id, outcome, member, i * 2 + offset, at(end)))
            calls = [(member, "ok", start, end)]
            if i % 8 == 0:
                calls.insert(0, (member, "error", start - 0.3, start - 0.1))
            if i % 6 == 0 and stage == "generate":
                calls.append((members[(i + 1) % 3], "ok", start + 0.05, end + rng.uniform(-0.5, 0.5)))
            for attempt, (who, result, began, ended) in enumerate(calls, start=1):
                cur.execute("INSERT INTO ai_attempts (pipeline, run_id, request_id, stage, attempt, member, "
                            "topic, kafka_partition, kafka_offset, started_at, ended_at, outcome) "
                            "VALUES (%s, %s, %s, %s, %s, %s, 't', 0, 0, %s, %s, %s)",
                            (PIPELINE, run_id, rid, stage, attempt, who, at(began), at(ended), result))
    # a request dead-lettered last (its dead letter ends the run), one still in flight (lost),
    # and a generate call cut short by a crash before the takeover's call (a duplicate)
    cur.execute("INSERT INTO requests (pipeline, request_id, run_id, status, entries, produced_at) VALUES "
                "(%s, %s, %s, 'dead_lettered', %s, %s), (%s, %s, %s, 'checking', %s, %s)",
                (PIPELINE, f"{run_id}-dl", run_id, ENTRIES, at(1.0),
                 PIPELINE, f"{run_id}-open", run_id, ENTRIES, at(2.0)))
    cur.execute("INSERT INTO dead_letters (pipeline, run_id, request_id, stage, reason, source_topic, "
                "kafka_partition, kafka_offset, at) VALUES (%s, %s, %s, 'check', 'http_4xx', %s, 0, 0, %s)",
                (PIPELINE, run_id, f"{run_id}-dl", f"{run_id}.style", at(12.5)))
    cur.execute("INSERT INTO ai_attempts (pipeline, run_id, request_id, stage, attempt, member, topic, "
                "kafka_partition, kafka_offset, started_at, ended_at, outcome) "
                "VALUES (%s, %s, %s, 'generate', 9, 'm2', 't', 0, 0, %s, NULL, 'started')",
                (PIPELINE, run_id, f"{run_id}-r1", at(0.5)))
    events = [("g-main", "m0", "revoke", 3.0), ("g-main", "m1", "revoke", 3.1),
              ("g-main", "m0", "assign", 3.9), ("g-main", "m1", "assign", 4.0),
              ("g-main", "m2", "max_poll_exceeded", 5.9), ("g-main", "m2", "lost", 6.0),
              ("g-main", "m0", "revoke", 6.2), ("g-main", "m0", "assign", 7.6),
              ("g-side", "m9", "revoke", 8.5)]
    for group, member, event, when in events:
        cur.execute("INSERT INTO rebalance_events (run_id, group_id, member, event, at) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    (run_id, group, member, event, at(when)))


WINDOWS_SQL = """
WITH ev AS (SELECT group_id, event, at FROM rebalance_events WHERE run_id = %(run)s),
done AS (SELECT completed_at FROM stage_results WHERE run_id = %(run)s AND stage = 'generate'),
run_end AS (SELECT greatest((SELECT max(at) FROM ev), (SELECT max(completed_at) FROM done)) AS t),
opens AS (SELECT group_id, at AS start, count(*) AS events FROM ev
          WHERE event IN ('revoke', 'lost') GROUP BY group_id, at),
closed AS (SELECT o.group_id, o.start, o.events,
                  greatest(o.start, coalesce((SELECT min(a.at) FROM ev a WHERE a.group_id = o.group_id
                                              AND a.event = 'assign' AND a.at >= o.start),
                                             (SELECT t FROM run_end))) AS finish
           FROM opens o),
flagged AS (SELECT *, CASE WHEN start <= max(finish) OVER (PARTITION BY group_id ORDER BY start, finish
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS new
            FROM closed),
islands AS (SELECT *, sum(new) OVER (PARTITION BY group_id ORDER BY start, finish ROWS UNBOUNDED PRECEDING)
                     AS island FROM flagged),
merged AS (SELECT group_id, min(start) AS start, max(finish) AS finish, sum(events) AS events
           FROM islands GROUP BY group_id, island)
SELECT group_id, start, finish, events,
       (SELECT count(*) FROM generate_series(floor(extract(epoch FROM start) / %(b)s)::bigint,
                                             floor(extract(epoch FROM finish) / %(b)s)::bigint) AS slot
        WHERE NOT EXISTS (SELECT 1 FROM done
                          WHERE floor(extract(epoch FROM done.completed_at) / %(b)s)::bigint = slot)) * %(b)s
FROM merged ORDER BY group_id, start
"""


def sql_figures(cur, run_id: str, bucket: int) -> dict:
    """The same figures straight from PostgreSQL: percentile_cont, COUNT, generate_series."""
    q = "ARRAY[0.5, 0.95, 0.99]"
    figures: dict = {}
    cur.execute("SELECT count(*) FROM requests WHERE run_id = %s", (run_id,))
    figures["requests"] = cur.fetchone()[0]
    cur.execute("SELECT count(*) FILTER (WHERE status = 'completed'), extract(epoch FROM greatest("
                "max(finished_at) FILTER (WHERE status IN ('completed', 'rejected')), "
                "(SELECT max(at) FROM dead_letters WHERE (pipeline, request_id) IN (SELECT pipeline, "
                "request_id FROM requests WHERE run_id = %s AND status = 'dead_lettered'))) "
                "- min(produced_at))::float8 FROM requests WHERE run_id = %s", (run_id, run_id))
    figures["completed"], figures["span_s"] = cur.fetchone()
    cur.execute("SELECT stage, floor(extract(epoch FROM completed_at) / %s)::bigint * %s, count(*) "
                "FROM stage_results WHERE run_id = %s GROUP BY 1, 2 ORDER BY 1, 2", (bucket, bucket, run_id))
    figures["completions"] = {}
    for stage, start, n in cur.fetchall():
        figures["completions"].setdefault(stage, []).append(
            {"bucket_start": datetime.fromtimestamp(start, UTC).isoformat(), "completions": n})
    figures["end_to_end"] = {}
    for measure in ("finished", "notified"):
        cur.execute(f"SELECT count(*), percentile_cont({q}) WITHIN GROUP "
                    f"(ORDER BY extract(epoch FROM {measure}_at - produced_at)) FROM requests "
                    f"WHERE run_id = %s AND status = 'completed' AND {measure}_at IS NOT NULL "
                    "AND produced_at IS NOT NULL", (run_id,))
        figures["end_to_end"][measure] = cur.fetchone()
    cur.execute(f"SELECT stage, count(*), percentile_cont({q}) WITHIN GROUP "
                "(ORDER BY extract(epoch FROM ended_at - started_at)) FROM ai_attempts "
                "WHERE run_id = %s AND outcome = 'ok' GROUP BY stage", (run_id,))
    figures["stages"] = {stage: (n, qs) for stage, n, qs in cur.fetchall()}
    cur.execute("SELECT member, count(*), count(*) FILTER (WHERE outcome = 'ok') FROM ai_attempts "
                "WHERE run_id = %s GROUP BY member", (run_id,))
    figures["members"] = {m: {"attempts": a, "ok": ok} for m, a, ok in cur.fetchall()}
    cur.execute("SELECT stage, sum(calls - 1) FROM (SELECT stage, count(*) AS calls FROM ai_attempts "
                "WHERE run_id = %s AND outcome IN ('ok', 'started') GROUP BY request_id, stage) c "
                "GROUP BY stage HAVING sum(calls - 1) > 0", (run_id,))
    figures["duplicates"] = {stage: int(n) for stage, n in cur.fetchall()}
    cur.execute(WINDOWS_SQL, {"run": run_id, "b": bucket})
    figures["windows"] = cur.fetchall()
    return figures


def assert_quantiles(spark_figures: dict, count: int, quantiles: list[float]) -> None:
    assert spark_figures["count"] == count
    assert [spark_figures[k] for k in ("p50", "p95", "p99")] == pytest.approx(quantiles, abs=1e-6)


@pytest.fixture(scope="module")
def synthetic_run(stack: Stack) -> Iterator[str]:
    run_id = unique("analysis-run")
    with psycopg2.connect(stack.database_url) as conn, conn.cursor() as cur:
        insert_run(cur, run_id)
    conn.close()
    yield run_id
    with psycopg2.connect(stack.database_url) as conn, conn.cursor() as cur:
        for table in ("requests", "stage_results", "ai_attempts", "rebalance_events", "dead_letters",
                      "analysis_pipeline"):
            cur.execute(f"DELETE FROM {table} WHERE run_id = %s", (run_id,))
    conn.close()


def test_pipeline_analysis_matches_sql(stack: Stack, synthetic_run: str, tmp_path: Path) -> None:
    run_id, output = synthetic_run, tmp_path / "pipeline.json"
    documents = pipeline_analysis.main(["--run-id", run_id, "--database-url", stack.database_url,
                                        "--output-json", str(output), "--bucket-seconds", "1"])
    figures = documents[run_id]
    with psycopg2.connect(stack.database_url) as conn, conn.cursor() as cur:
        expected = sql_figures(cur, run_id, 1)
        cur.execute("SELECT figures FROM analysis_pipeline WHERE run_id = %s", (run_id,))
        stored = cur.fetchone()[0]
    conn.close()

    assert json.loads(output.read_text()) == stored == json.loads(json.dumps(figures))
    assert (figures["requests"], figures["completed"]) == (expected["requests"], expected["completed"])
    assert figures["status"] == {"completed": 36, "rejected": 4, "dead_lettered": 1, "checking": 1}
    assert figures["last_terminal_at"] == at(12.5).isoformat()  # the dead letter, after every generation
    assert figures["span_s"] == pytest.approx(expected["span_s"])
    assert figures["throughput_rps"] == pytest.approx(36 / expected["span_s"])
    assert figures["completions"] == expected["completions"]
    for measure, (count, quantiles) in expected["end_to_end"].items():
        assert_quantiles(figures["latency_s"]["end_to_end"][measure], count, quantiles)
    assert set(figures["latency_s"]["stages"]) == set(expected["stages"]) == {"check", "generate"}
    for stage, (count, quantiles) in expected["stages"].items():
        assert_quantiles(figures["latency_s"]["stages"][stage], count, quantiles)
    assert figures["members"] == expected["members"]
    assert figures["duplicates"] == {"total": sum(expected["duplicates"].values()),
                                     "by_stage": expected["duplicates"]}
    assert figures["duplicates"]["by_stage"]["generate"] == 8  # 7 double 'ok' calls and 1 'started'

    windows = [(w["group_id"], datetime.fromisoformat(w["start"]), datetime.fromisoformat(w["end"]),
                w["events"], w["cost_seconds"]) for w in figures["rebalances"]["windows"]]
    assert windows == [tuple(row) for row in expected["windows"]]
    assert [w[0] for w in windows] == ["g-main", "g-main", "g-side"]  # 3.0 and 3.1 merged; 6.0 and 6.2 merged
    assert figures["rebalances"]["cost_seconds"] == sum(row[4] for row in expected["windows"])
    assert figures["rebalances"]["events"] == {"assign": 3, "lost": 1, "max_poll_exceeded": 1, "revoke": 4}


# --- the benchmark's SQL figures and the Spark analysis agree ---------------------------------

# One unit of each figure's rounding (measure.figures.run_figures): the two sides compute from
# the same rows through different engines (PostgreSQL numerics, Spark microseconds). Each side
# rounds, so they may be one unit apart, and a float's own error on top: a tolerance of 1.5 units
# (834.795 against 834.796 failed at exactly one).
ROUNDING = {"span_s": 1e-3, "throughput_rps": 1e-3, "steady_throughput_rps": 1e-3, "capacity_rps": 1e-3,
            "utilization": 1e-4, "skew_max_over_mean": 1e-3, "skew_cv": 1e-3, "p50_ms": 0.1, "p95_ms": 0.1,
            "p99_ms": 0.1}


def assert_agree(bench_side: dict, spark_side: dict) -> None:
    """Every standard figure (the Spark side's keys) agrees within rounding."""
    assert set(spark_side) <= set(bench_side)
    for key, value in ((k, bench_side[k]) for k in spark_side):
        if key in ROUNDING and value is not None:
            assert spark_side[key] == pytest.approx(value, abs=1.5 * ROUNDING[key]), key
        elif key == "service_s":
            assert spark_side[key] == pytest.approx(value, abs=1e-5), key
        elif key == "capacity_candidates":  # rounded as capacity_rps is
            assert spark_side[key] == pytest.approx(value, abs=1.5 * ROUNDING["capacity_rps"]), key
        else:
            assert spark_side[key] == value, key


def spark_document(stack: Stack, spark: SparkSession, run_id: str, final_stage: str = "generate") -> dict:
    frames = pipeline_analysis.load_runs(spark, job_io.jdbc_from(stack.database_url), [run_id])
    return pipeline_analysis.analyse(frames, [run_id], final_stage=final_stage)[run_id]


def test_bench_and_spark_agree_on_a_synthetic_run(stack: Stack, spark: SparkSession,
                                                  synthetic_run: str) -> None:
    document = spark_document(stack, spark, synthetic_run)
    bench_side, _ = standard_figures(stack.database_url, synthetic_run, "generate", 43, 16, [])
    spark_side = measure_figures.from_analysis(document, produced=43, ai_limit=16, skew_max_over_mean=None,
                                               skew_cv=None)
    assert_agree(bench_side, spark_side)
    assert (bench_side["lost"], bench_side["duplicate_ai_calls"]) == (2, 8)  # 43 - 41 settled; see insert_run
    assert bench_side["bottleneck_stage"] == "generate" and bench_side["steady_throughput_rps"] > 0
    assert bench_side["binding_limit"] == "generate.concurrency"


@pytest.fixture(scope="module")
def real_run(stack: Stack) -> str:
    """A burst through the real pipeline (in-process fleets, stand-in at a fast time scale)."""
    config = PipelineConfig(partitions=8, time_scale=TIME_SCALE, replication_factor=1,
                            stages={"check": StageConfig("flow", members=1, window=16),
                                    "generate": StageConfig("flow", members=2, window=8)})
    with ai_service(limit=16) as ai, running_pipeline(config, stack.kafka, stack.database_url,
                                                      ai.endpoints) as pipeline:
        pipeline.send(REAL_BURST, reject_share=0.1)
        pipeline.wait_terminal(REAL_BURST, timeout_s=180)
    return pipeline.run_id


REAL_BURST = 200


@pytest.fixture(scope="module")
def text_run(stack: Stack) -> str:
    """A burst through text_moderation, whose requests complete at a stage that calls no model:
    the join of two models' answers, called in parallel."""
    config = PipelineConfig(pipeline="text_moderation", partitions=8, time_scale=TIME_SCALE,
                            replication_factor=1)
    with ai_service(limit=16) as ai, running_pipeline(config, stack.kafka, stack.database_url,
                                                      ai.endpoints_of("text_moderation")) as pipeline:
        pipeline.send(TEXT_BURST, reject_share=0.2)
        pipeline.wait_terminal(TEXT_BURST, timeout_s=180)
    return pipeline.run_id


TEXT_BURST = 120


def agreeing_figures(stack: Stack, spark: SparkSession, run_id: str, pipeline: str, produced: int) -> dict:
    """A real run's figures from the benchmark's SQL, once they agree with the Spark analysis and
    the partition load of the pipeline's measured topic, as the gate reads them."""
    topics = Topics(run_id, pipeline_spec.load(pipeline))
    measured = topics.name(topics.spec.load.measure)
    bench_side = bench_figures.scenario_figures(stack.database_url, stack.connection, run_id, topics,
                                                produced, 16)
    document = spark_document(stack, spark, run_id, topics.spec.completing_stage)
    load = partition_load.analyse(partition_load.read_records(spark, stack.connection, [measured]),
                                  {measured: len(bench_side["requests_per_partition"])})
    (skew,) = load.skew
    spark_side = measure_figures.from_analysis(
        document, produced=produced, ai_limit=16, skew_max_over_mean=skew["max_over_mean"],
        skew_cv=skew["cv"], skew_records=skew["records"], skew_partitions=skew["partitions"])
    assert_agree(bench_side, spark_side)
    assert sum(bench_side["requests_per_partition"]) == skew["records"] == produced
    assert bench_side["completed"] + bench_side["status"]["rejected"] == produced
    assert bench_side["lost"] == bench_side["duplicate_ai_calls"] == 0
    assert bench_side["skew_max_over_mean"] >= 1
    return bench_side


def test_bench_and_spark_agree_on_a_real_run(stack: Stack, spark: SparkSession, real_run: str) -> None:
    assert agreeing_figures(stack, spark, real_run, "genai_image", REAL_BURST)["utilization"] > 0


def test_bench_and_spark_agree_on_a_run_completed_by_a_join(stack: Stack, spark: SparkSession,
                                                            text_run: str) -> None:
    figures = agreeing_figures(stack, spark, text_run, "text_moderation", TEXT_BURST)
    # completed at the join, which calls no model: the capacity is bound by a stage that does
    stage, limit = figures["binding_limit"].split(".")
    assert stage in ("moderate", "summarize", "classify") and limit == "concurrency"
    assert figures["completed"] == scalar(stack.database_url, "SELECT count(*) FROM stage_results "
                                          "WHERE run_id = %s AND stage = 'join'", text_run)
