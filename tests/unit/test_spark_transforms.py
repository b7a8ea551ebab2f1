"""The analysis jobs' transformations on small in-memory frames, against hand-computed figures."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from measure import sizing, skew
from spark import job_io, partition_load, pipeline_analysis

T0 = datetime(2026, 1, 1, tzinfo=UTC)  # epoch seconds 1767225600: every bucket boundary lines up
T0_S = 1_767_225_600
P = "genai_image"
RECORDS = "topic string, partition int, offset long, bytes int, key binary, ts_ms long"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def by(rows: list[dict], *keys: str) -> dict:
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in rows}


def collect(frame: DataFrame) -> list[dict]:
    return [r.asDict() for r in frame.collect()]


# --- partition load ---------------------------------------------------------------------------

def test_project_counts_null_key_and_value_as_zero_bytes(spark: SparkSession) -> None:
    kafka = spark.createDataFrame(
        [("t", 0, 7, b"abc", b"0123456789", at(1.5)), ("t", 1, 8, None, b"01234", at(2)),
         ("t", 1, 9, b"k", None, at(3))],
        "topic string, partition int, offset long, key binary, value binary, timestamp timestamp")
    rows = collect(partition_load.project(kafka))
    assert [(r["partition"], r["bytes"], r["ts_ms"]) for r in rows] == [
        (0, 13, (T0_S + 1.5) * 1000), (1, 5, (T0_S + 2) * 1000), (1, 1, (T0_S + 3) * 1000)]
    assert tuple(rows[0]) == partition_load.RECORD_COLUMNS


def test_partition_aggregates_count_records_bytes_keys_and_buckets(spark: SparkSession) -> None:
    records = spark.createDataFrame(
        [("t", 0, 10, b"a", 5000), ("t", 0, 12, b"a", 0), ("t", 0, 7, b"b", 5000), ("t", 0, 3, None, 0),
         ("t", 2, 5, None, 0), ("u", 0, 1, b"a", 0)],
        "topic string, partition int, bytes int, key binary, ts_ms long")
    buckets = partition_load.bucket_aggregates(records, 1, distinct_keys=True)
    rows = by(collect(partition_load.partition_aggregates(buckets, distinct_keys=True)), "topic", "partition")
    # key a of t/0 is in the buckets at 0 s and 5 s: one key, not two
    assert {k: (r["records"], r["bytes"], r["distinct_keys"], r["keyless"], r["sampled"])
            for k, r in rows.items()} == {("t", 0): (4, 32, 2, 1, 4), ("t", 2): (1, 5, 0, 1, 1),
                                          ("u", 0): (1, 1, 1, 0, 1)}
    t0 = rows[("t", 0)]
    assert (t0["bucket_starts"], t0["bucket_records"]) == ([0, 5], [2, 2])  # in time order
    # every record sampled (no rate): a twice across two buckets, then b; no key for t/2
    assert [(bytes(k["key"]), k["sampled"]) for k in t0["top_keys"]] == [(b"a", 2), (b"b", 1)]
    assert rows[("t", 2)]["top_keys"] == []
    plain = by(collect(partition_load.partition_aggregates(partition_load.bucket_aggregates(records, 1))),
               "topic", "partition")
    assert {k: (r["records"], r["distinct_keys"]) for k, r in plain.items()} == {
        ("t", 0): (4, None), ("t", 2): (1, None), ("u", 0): (1, None)}  # no sketch unless asked


def test_the_key_sample_estimates_a_hot_keys_share_within_its_error(spark: SparkSession) -> None:
    """200,000 records over 2 partitions, every fifth keyed `hot`: each partition sampled at the
    rate measure.skew gives for 100,000 records, one read."""
    records = spark.range(200_000).select(
        F.lit("t").alias("topic"), (F.col("id") % 2).cast("int").alias("partition"),
        (F.col("id") / 2).cast("long").alias("offset"), F.lit(10).alias("bytes"),
        F.when(F.col("id") % 5 == 0, F.lit("hot")).otherwise(F.col("id").cast("string")).cast("binary")
        .alias("key"), F.lit(T0_S * 1000).alias("ts_ms"))
    result = partition_load.analyse(records, {"t": 2}, partition_records={"t": [100_000, 100_000]})
    sample = skew.key_sample_size()["records"]
    for p in result.partitions:
        hot = p["top_keys"][0]
        assert p["records"] == 100_000 and sample <= p["sampled"] < 2 * sample
        assert hot["key"] == "hot" and hot["share"] == pytest.approx(0.2, abs=0.01)
        assert hot["topic_share"] == pytest.approx(0.1, abs=0.005)
        assert p["top_keys"][1]["sampled"] == 1  # every other key once at most
    assert result.skew[0]["diagnosis"]["cause"] == "balanced"


def test_distinct_keys_are_exact_for_tens_of_thousands_of_keys(spark: SparkSession) -> None:
    """30,000 distinct keys, each sent twice, over 3 one-second buckets of one partition."""
    keys = spark.range(60_000).select(
        F.lit("t").alias("topic"), F.lit(0).alias("partition"), F.lit(1).alias("bytes"),
        F.concat(F.lit("key-"), (F.col("id") % 30_000).cast("string")).cast("binary").alias("key"),
        (F.lit(T0_S * 1000) + F.col("id") % 3 * 1000).alias("ts_ms"))
    buckets = partition_load.bucket_aggregates(keys, 1, distinct_keys=True)
    (row,) = collect(partition_load.partition_aggregates(buckets, distinct_keys=True))
    assert (row["records"], row["distinct_keys"]) == (60_000, 30_000)


def test_bucket_aggregates_per_partition_and_epoch_aligned_bucket(spark: SparkSession) -> None:
    offsets_ms = [(0, 0), (0, 1999), (0, 2000), (0, 3500), (1, 5999), (1, 6000)]
    records = spark.createDataFrame([("t", p, 1, None, T0_S * 1000 + ms) for p, ms in offsets_ms],
                                    "topic string, partition int, bytes int, key binary, ts_ms long")
    rows = by(collect(partition_load.bucket_aggregates(records, 2)), "partition", "bucket_start")
    assert {k: r["records"] for k, r in rows.items()} == {
        (0, T0_S): 2, (0, T0_S + 2): 2, (1, T0_S + 4): 1, (1, T0_S + 6): 1}


def test_analyse_collects_zero_filled_partitions_skew_and_hot_list(spark: SparkSession) -> None:
    rows = [("t", p, i, 100, f"k{i % 3}".encode(), T0_S * 1000 + i) for p, n in [(1, 6), (2, 1), (3, 1)]
            for i in range(n)]
    records = spark.createDataFrame(rows, RECORDS)
    result = partition_load.analyse(records, {"t": 4, "empty": 2}, hot_threshold=2.0, bucket_seconds=1,
                                    distinct_keys=True)
    got = [(p["topic"], p["partition"], p["records"], p["bytes"], p["distinct_keys"], p["hot"])
           for p in result.partitions]
    assert got == [("empty", 0, 0, 0, 0, False), ("empty", 1, 0, 0, 0, False), ("t", 0, 0, 0, 0, False),
                   ("t", 1, 6, 600, 3, True), ("t", 2, 1, 100, 1, False), ("t", 3, 1, 100, 1, False)]
    empty, topic = result.skew
    assert (empty["topic"], empty["records"], empty["partitions"], empty["hot_partitions"]) == (
        "empty", 0, 2, [])
    assert (empty["gini"], empty["hottest_partition"], empty["max_over_mean"]) == (None, None, None)
    assert (topic["records"], topic["partitions"], topic["hot_partitions"]) == (8, 4, [1])
    assert topic["max_over_mean"] == pytest.approx(3.0)  # 0, 6, 1, 1: mean 2, population variance 5.5
    assert topic["cv"] == pytest.approx(math.sqrt(5.5) / 2)
    # |xi - xj| over the ordered pairs sums to 36; 36 / (2 * 4^2 * mean 2)
    assert topic["gini"] == pytest.approx(36 / 64)
    assert (topic["hottest_partition"], topic["hottest_share"]) == (1, pytest.approx(0.75))
    assert [(b["partition"], b["bucket_start"], b["records"]) for b in result.buckets] == [
        (1, T0_S, 6), (2, T0_S, 1), (3, T0_S, 1)]


def test_analyse_counts_a_key_once_across_buckets(spark: SparkSession) -> None:
    rows = [("t", p, i, 10, f"k{i % 2}".encode(), T0_S * 1000 + 1000 * i)
            for p in range(3) for i in range(p + 1)]
    records = spark.createDataFrame(rows, RECORDS)
    result = partition_load.analyse(records, {"t": 3}, distinct_keys=True)
    # partition p holds p + 1 records, one a second, keyed k0, k1, k0: keys 1, 2, 2
    assert [(p["records"], p["distinct_keys"]) for p in result.partitions] == [(1, 1), (2, 2), (3, 2)]
    assert [(b["partition"], b["bucket_start"] - T0_S, b["records"]) for b in result.buckets] == [
        (0, 0, 1), (1, 0, 1), (1, 1, 1), (2, 0, 1), (2, 1, 1), (2, 2, 1)]


def test_a_key_is_shown_as_text_when_printable_else_in_hex() -> None:
    assert partition_load.key_text(b"req-42") == "req-42"
    assert partition_load.key_text(bytearray(b"\x00\x12\xff")) == "0x0012ff"  # binary UUIDs
    assert partition_load.key_text("é".encode()) == "é"


def test_collect_sorted_puts_nulls_first_as_spark_sorts(spark: SparkSession) -> None:
    frame = spark.createDataFrame([("b", 2), (None, 1), ("a", 3), ("a", None)], "s string, n int")
    assert [(r["s"], r["n"]) for r in job_io.collect_sorted(frame, "s", "n")] == [
        (None, 1), ("a", None), ("a", 3), ("b", 2)]
    assert job_io.collect_sorted(frame, "s", "n") == collect(frame.orderBy("s", "n"))


# --- pipeline analysis ------------------------------------------------------------------------

RUN = "run-x"


def run_frames(spark: SparkSession) -> pipeline_analysis.RunFrames:
    """A small run (RUN): 5 requests (3 completed, 1 rejected, 1 dead-lettered), stages check and
    generate, 3 members, two consumer groups."""
    requests = spark.createDataFrame(
        [(P, "r1", "completed", at(0), at(1), at(1.5)), (P, "r2", "completed", at(0.5), at(2.5), None),
         (P, "r3", "completed", at(1), at(4), at(5)), (P, "r4", "rejected", at(2), at(2.2), None),
         (P, "r5", "dead_lettered", at(3), None, None)],
        "pipeline string, request_id string, status string, produced_at timestamp, "
        "finished_at timestamp, notified_at timestamp")
    stage_results = spark.createDataFrame(
        [("r1", "check", "ok", "m1", at(10.05)), ("r2", "check", "ok", "m2", at(10.9)),
         ("r3", "check", "rejected", "m1", at(12.2)),
         ("r1", "generate", "ok", "m1", at(10.1)), ("r2", "generate", "ok", "m2", at(11.7)),
         ("r4", "generate", "ok", "m3", at(20.4)), ("r3", "generate", "ok", "m3", at(33.2))],
        "request_id string, stage string, outcome string, member string, completed_at timestamp")
    attempts = spark.createDataFrame(
        [("r1", "check", "m1", "ok", 200, at(0), at(1)), ("r1", "check", "m2", "ok", 200, at(1), at(3)),
         ("r1", "check", "m2", "ok", 200, at(3), at(6)),
         ("r1", "check", "m1", "http_5xx", 500, at(6), at(6.5)),
         ("r2", "check", "m2", "ok", 200, at(0), at(4)),
         ("r1", "generate", "m3", "ok", 200, at(0), at(2)), ("r1", "generate", "m3", "ok", 200, at(2), at(3)),
         ("r2", "generate", "m1", "timeout", None, at(0), at(9))],
        "request_id string, stage string, member string, outcome string, http_status int, "
        "started_at timestamp, ended_at timestamp")
    rebalances = spark.createDataFrame(
        [("g1", "m1", "revoke", at(10.2)), ("g1", "m2", "revoke", at(10.5)), ("g1", "m1", "assign", at(12.3)),
         ("g1", "m2", "assign", at(12.4)), ("g1", "m3", "max_poll_exceeded", at(19.9)),
         ("g1", "m3", "lost", at(20.0)), ("g1", "m1", "assign", at(21.5)), ("g2", "m9", "revoke", at(30.0))],
        "group_id string, member string, event string, at timestamp")
    # r5's dead letter ends it at 6.0; r1's (a completed request) and another pipeline's r5 do not count
    dead_letters = spark.createDataFrame([(P, "r5", at(6.0)), (P, "r1", at(50.0)), ("other", "r5", at(40.0))],
                                         "pipeline string, request_id string, at timestamp")
    frames = (requests, stage_results, attempts, rebalances, dead_letters)
    return pipeline_analysis.RunFrames(*(in_run(frame) for frame in frames))


def in_run(frame: DataFrame, run_id: str = RUN) -> DataFrame:
    """The frame's rows as rows of `run_id`, the column every pipeline_analysis frame carries."""
    return frame.select(F.lit(run_id).alias("run_id"), "*")


def test_completions_per_stage_and_bucket(spark: SparkSession) -> None:
    frames = run_frames(spark)
    rows = by(collect(pipeline_analysis.completions(frames.stage_results, 2)), "stage", "bucket_start")
    assert {r["run_id"] for r in rows.values()} == {RUN}
    assert {k: r["completions"] for k, r in rows.items()} == {
        ("check", T0_S + 10): 2, ("check", T0_S + 12): 1, ("generate", T0_S + 10): 2,
        ("generate", T0_S + 20): 1, ("generate", T0_S + 32): 1}


def test_percentiles_interpolate_linearly_between_ranks(spark: SparkSession) -> None:
    values = [("a", 4.0), ("a", 1.0), ("a", 3.0), ("a", 2.0), ("b", 7.0)]
    frame = spark.createDataFrame(values, "k string, v double")
    rows = by(collect(pipeline_analysis.percentiles(frame, ["k"], "v")), "k")
    # rank (n - 1) * q: 1.5 -> 2.5, 2.85 -> 3.85, 2.97 -> 3.97
    assert (rows["a"]["count"], rows["a"]["p50"], rows["a"]["p95"], rows["a"]["p99"]) == (
        4, pytest.approx(2.5), pytest.approx(3.85), pytest.approx(3.97))
    assert (rows["b"]["p50"], rows["b"]["p99"]) == (7.0, 7.0)


def test_end_to_end_latency_uses_requests_with_both_ends(spark: SparkSession) -> None:
    rows = by(collect(pipeline_analysis.end_to_end_latency(run_frames(spark).requests)), "measure")
    finished, notified = rows["finished"], rows["notified"]  # finished 1, 2, 3 s; notified 1.5, 4 s
    assert (finished["count"], finished["p50"], finished["p95"]) == (
        3, pytest.approx(2.0), pytest.approx(2.9))
    assert (notified["count"], notified["p50"], notified["p99"]) == (
        2, pytest.approx(2.75), pytest.approx(1.5 + 0.99 * 2.5))


def test_end_to_end_latency_counts_completed_requests_only(spark: SparkSession) -> None:
    requests = spark.createDataFrame(
        [("a", "completed", at(0), at(2), at(3)), ("b", "rejected", at(0), at(0.2), at(0.4))],
        "request_id string, status string, produced_at timestamp, finished_at timestamp, "
        "notified_at timestamp")
    rows = by(collect(pipeline_analysis.end_to_end_latency(in_run(requests))), "measure")
    assert (rows["finished"]["count"], rows["finished"]["p50"]) == (1, pytest.approx(2.0))
    assert (rows["notified"]["count"], rows["notified"]["p50"]) == (1, pytest.approx(3.0))


def test_last_terminal_state_is_a_rejection_finishing_last(spark: SparkSession) -> None:
    frames = run_frames(spark)
    requests = frames.requests.unionByName(spark.createDataFrame(
        [(RUN, P, "r6", "rejected", at(4), at(7.5), None), (RUN, P, "r7", "checking", at(5), None, None)],
        frames.requests.schema))
    doc = pipeline_analysis.analyse(dataclasses.replace(frames, requests=requests), [RUN])[RUN]
    assert doc["last_terminal_at"] == at(7.5).isoformat()  # r6's rejection, after r5's dead letter at 6


def test_stage_latency_counts_successful_attempts_only(spark: SparkSession) -> None:
    rows = by(collect(pipeline_analysis.stage_latency(run_frames(spark).attempts)), "stage")
    assert (rows["check"]["count"], rows["check"]["p50"]) == (4, pytest.approx(2.5))  # 1, 2, 3, 4 s
    assert rows["check"]["mean"] == pytest.approx(2.5)
    assert (rows["generate"]["count"], rows["generate"]["p50"]) == (2, pytest.approx(1.5))  # 2, 1 s
    assert rows["generate"]["mean"] == pytest.approx(1.5)


def test_band_work_counts_ok_call_seconds_inside_the_band_and_calls_started_in_it_and_before(
        spark: SparkSession) -> None:
    # band 1.5 -> 3.5 s: check's ok calls 0-1 (0 s, before), 1-3 (1.5 s, before), 3-6 (0.5 s,
    # started inside), 0-4 (2 s, before); generate's 0-2 (0.5 s, before), 2-3 (1 s, started
    # inside); the timeout does not count
    band = (at(1.5).timestamp(), at(3.5).timestamp())
    rows = by(collect(pipeline_analysis.band_work(run_frames(spark).attempts, {RUN: band})), "stage")
    got = {stage: (r["busy_s"], r["started"], r["before"], r["first_s"]) for stage, r in rows.items()}
    assert got == {"check": (pytest.approx(4.0), 1, 3, pytest.approx(at(0).timestamp())),
                   "generate": (pytest.approx(1.5), 1, 1, pytest.approx(at(0).timestamp()))}


def test_member_load_and_duplicate_calls(spark: SparkSession) -> None:
    frames = run_frames(spark)
    load = by(collect(pipeline_analysis.member_load(frames.attempts)), "member")
    assert {m: (r["attempts"], r["ok"]) for m, r in load.items()} == {
        "m1": (3, 1), "m2": (3, 3), "m3": (2, 2)}
    repeated = by(collect(pipeline_analysis.repeated_calls(frames.attempts)), "request_id", "stage")
    # r1/check: 3 ok and a 5xx (not billed); r2/check: 1 ok (not repeated); r1/generate: 2 ok;
    # r2/generate: one abandoned try alone
    assert {k: r["calls"] for k, r in repeated.items()} == {("r1", "check"): 3, ("r1", "generate"): 2}


def test_duplicate_calls_count_calls_cut_by_a_crash_or_abandoned_by_a_timeout(spark: SparkSession) -> None:
    attempts = spark.createDataFrame(
        [("r1", "generate", "m1", "started", None, at(0), None),
         ("r1", "generate", "m2", "ok", 200, at(40), at(43)),
         ("r2", "generate", "m2", "started", None, at(1), None),
         ("r3", "generate", "m1", "http_5xx", 500, at(2), at(5)),
         ("r3", "generate", "m1", "ok", 200, at(6), at(9)),
         ("r4", "generate", "m1", "timeout", None, at(0), at(30)),
         ("r4", "generate", "m1", "ok", 200, at(31), at(34)),
         ("r5", "generate", "m1", "timeout", 503, at(0), at(30)),
         ("r5", "generate", "m1", "ok", 200, at(31), at(34)),
         ("r6", "generate", "m1", "connection_error", None, at(0), at(1)),
         ("r6", "generate", "m1", "connection_error", 200, at(2), at(3)),
         ("r6", "generate", "m1", "ok", 200, at(4), at(7))],
        "request_id string, stage string, member string, outcome string, http_status int, "
        "started_at timestamp, ended_at timestamp")
    repeated = collect(pipeline_analysis.repeated_calls(in_run(attempts)))
    # r1: a call cut short by a crash, then the takeover's call -> 2 calls; r2: one interrupted
    # call alone; r3: a 5xx produced nothing, then one ok; r4: a try abandoned by its timeout (the
    # provider went on and billed it), then one ok -> 2; r5: the abandoned try's answer had begun
    # with a 503 (refused, not billed); r6: a refused connection (nothing sent), one broken after
    # a 200 began (billed), then one ok -> 2.
    assert [(r["request_id"], r["stage"], r["calls"]) for r in repeated] == [
        ("r1", "generate", 2), ("r4", "generate", 2), ("r6", "generate", 2)]


def test_rebalance_windows_merge_and_cost_idle_buckets(spark: SparkSession) -> None:
    frames = run_frames(spark)
    run_end = (T0_S + 33.2) * 1_000_000  # the last generate completion, after the last event
    windows = pipeline_analysis.rebalance_windows(frames.rebalances, {RUN: int(run_end)})
    costed = collect(pipeline_analysis.rebalance_cost(windows, frames.stage_results, "generate", 1))
    got = sorted((w["group_id"], w["start_us"], w["end_us"], w["events"], w["cost_seconds"]) for w in costed)
    us = 1_000_000
    assert got == [
        # two revokes close at the first assign (12.3): buckets 10, 11, 12; completions in 10 and 11
        ("g1", (T0_S * us) + 10_200_000, (T0_S * us) + 12_300_000, 2, 1),
        # lost at 20.0 closes at 21.5: buckets 20 (a completion at 20.4) and 21
        ("g1", (T0_S * us) + 20_000_000, (T0_S * us) + 21_500_000, 1, 1),
        # never reassigned: open until the run's end (33.2); buckets 30..33, a completion in 33
        ("g2", (T0_S * us) + 30_000_000, int(run_end), 1, 3),
    ]


def test_analyse_document(spark: SparkSession) -> None:
    doc = pipeline_analysis.analyse(run_frames(spark), [RUN], bucket_seconds=1)[RUN]
    assert (doc["requests"], doc["completed"]) == (5, 3)
    assert doc["status"] == {"completed": 3, "dead_lettered": 1, "rejected": 1}
    # first produced at 0; last terminal state: r5's dead letter at 6 (after r3's finish at 4)
    assert (doc["first_produced_at"], doc["last_terminal_at"]) == (at(0).isoformat(), at(6).isoformat())
    assert (doc["span_s"], doc["throughput_rps"]) == (pytest.approx(6.0), pytest.approx(0.5))
    assert doc["steady_throughput_rps"] == 0.0  # 4 generate completions: too few for a plateau
    assert doc["service_s"] == {"check": pytest.approx(2.5), "generate": pytest.approx(1.5)}
    assert doc["ok_calls"] == {"check": 4, "generate": 2}
    assert (doc["steady_band"], doc["band_work"]) == (None, {})  # too few completions for a plateau
    assert doc["duplicates"] == {"total": 3, "by_stage": {"check": 2, "generate": 1}}
    assert doc["rebalances"]["cost_seconds"] == 5
    assert doc["rebalances"]["events"] == {"assign": 3, "lost": 1, "max_poll_exceeded": 1, "revoke": 3}
    assert [w["seconds"] for w in doc["rebalances"]["windows"]] == [pytest.approx(2.1), pytest.approx(1.5),
                                                                    pytest.approx(3.2)]
    assert doc["completions"]["generate"][0] == {"bucket_start": at(10).isoformat(), "completions": 1}
    assert doc["latency_s"]["stages"]["generate"]["p99"] == pytest.approx(1.99)


def test_runs_analysed_together_get_the_documents_each_gets_alone(spark: SparkSession) -> None:
    frames = run_frames(spark)

    def later(frame: DataFrame) -> DataFrame:
        """A second run's rows: the first's without r4 and r5, 100 s later, under run-y."""
        if "request_id" in frame.columns:
            frame = frame.where(~F.col("request_id").isin("r4", "r5"))
        shift = F.expr("INTERVAL 100 SECONDS")
        return frame.select(*(F.lit("run-y").alias(name) if name == "run_id"
                              else (F.col(name) + shift).alias(name) if kind == "timestamp"
                              else F.col(name) for name, kind in frame.dtypes))

    other = pipeline_analysis.RunFrames(*(later(f) for f in frames.frames()))
    both = pipeline_analysis.RunFrames(*(a.unionByName(b) for a, b in zip(
        frames.frames(), other.frames(), strict=True)))
    together = pipeline_analysis.analyse(both, [RUN, "run-y", "run-z"])
    assert together[RUN] == pipeline_analysis.analyse(frames, [RUN])[RUN]
    assert together["run-y"] == pipeline_analysis.analyse(other, ["run-y"])["run-y"]
    assert together["run-y"]["requests"] == 3 and together["run-y"]["rebalances"]["windows"]
    assert (together["run-z"]["requests"], together["run-z"]["span_s"]) == (0, None)  # no rows


# --- sizing and helpers -----------------------------------------------------------------------

def test_partitions_for_rounds_up_but_not_past_an_exact_quotient() -> None:
    assert sizing.partitions_for(100, 25) == 4
    assert sizing.partitions_for(101, 25) == 5
    assert sizing.partitions_for(100, 4 / 3) == 75  # 100 / 1.333... is 75.00000000000001
    assert sizing.partitions_for(0.5, 10) == 1


def test_sizing_takes_the_larger_of_the_produce_and_consume_terms() -> None:
    produce_bound = sizing.size(sizing.SizingInput(
        target=1000, produce_per_partition=60, consume_per_partition=250, current_partitions=32))
    terms = (produce_bound["by_produce"], produce_bound["by_consume"], produce_bound["partitions"])
    assert terms == (17, 4, 17)
    assert produce_bound["limiting"] == "produce" and produce_bound["warning"] is None

    # AI consumers: 8 calls in flight per partition at 3 s each -> 8/3 per s; 21.3 / (8/3) = 7.99 -> 8
    ai = sizing.size(sizing.SizingInput(
        target=21.3, produce_per_partition=5000, concurrency_per_partition=8, service_time_s=3,
        current_partitions=6))
    assert ai["t_consume"] == pytest.approx(8 / 3)
    assert (ai["by_produce"], ai["by_consume"], ai["partitions"], ai["limiting"]) == (1, 8, 8, "consume")
    assert "6 to 8 partitions" in ai["warning"] and "keys" in ai["warning"]
    assert ai["reasoning"][-1] == "partitions = max(1, 8) = 8, limited by: consume"


def test_sizing_needs_a_consume_rate() -> None:
    with pytest.raises(ValueError, match="concurrency_per_partition"):
        sizing.size(sizing.SizingInput(target=10, produce_per_partition=5))


def test_jdbc_settings_move_credentials_out_of_the_url() -> None:
    jdbc = job_io.jdbc_from("postgresql://ana:s%40cret@db.example:5433/pipeline?sslmode=require")
    assert jdbc.options() == {"url": "jdbc:postgresql://db.example:5433/pipeline?sslmode=require",
                              "driver": "org.postgresql.Driver", "user": "ana", "password": "s@cret"}
    assert job_io.sql_literal("it's") == "'it''s'"
