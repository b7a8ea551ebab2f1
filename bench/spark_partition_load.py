"""Benchmark: `partition_load` over 1M and 10M records against Kafka's own ConsumerPerformance
reading the same topic in the same run (not a test), with its `--distinct-keys` variant beside it.

Each size gets a fresh topic filled by the data generator (100-byte values, 64 partitions by
default). Kafka's ConsumerPerformance reads the whole topic first (fresh group, from the
beginning), then the job is timed in one reused Spark session, data generation excluded; the
ratio of their records/s says how close the job comes to what a plain Kafka consumer reads on
the same machine. With `--repeat N` both run N times and the best of each is compared: the
machine's noise is met the same way on both sides, and every run is kept in the summary. A bare
scan (the Kafka read alone, counted) is timed first, so the job's first run finds the JVM's
Kafka read compiled, as ConsumerPerformance's single loop soon is. The job's per-partition
totals are checked against the generator's counts, so a fast wrong answer cannot pass. The job
runs with its default figures (the key sample sized from the generator's counts, as the broker's
offsets size it in `main`); the distinct-key variant alternates with it, and the ratio the
targets judge is the default job's.
Results: a table on the console and results/spark-bench-<UTC time>/summary.json, with the
targets and whether the run met them.

    python -m bench.spark_partition_load --sizes 1000000,10000000 --master 'local[*]'
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from rich.console import Console
from rich.table import Table

from consumers.config import kafka_connection
from consumers.config.kafka_connection import KafkaConnection
from consumers.kafka_clients.provisioning import delete
from consumers.loadgen import datagen
from infra import kafka_tools
from spark import partition_load
from spark.session import session

REPO = Path(__file__).resolve().parent.parent
APP_NAME = "bench-partition-load"
# Benchmark targets on the 2-core reference machine: printed and saved, never asserted.
TARGET_RECORDS = 10_000_000
TARGET_JOB_S = 30.0
TARGET_RATIO = 0.67


@dataclass(frozen=True)
class ConsumerPerf:
    """One ConsumerPerformance run, in the tool's own figures.

    `records_per_s` is its `nMsg.sec` column: records over the time from just after the consumer
    is constructed to the last record, so it includes subscribing, the group join and the first
    offset lookup (`rebalance.time.ms`), but neither the JVM start nor the consumer's
    construction. That is what the job's time covers too (a warm session; the job's own offset
    lookups and planning included), so the ratio uses it. `fetch_records_per_s` is
    `fetch.nMsg.sec`: the same records over `fetch.time.ms`, the join taken out.
    """

    records: int
    records_per_s: float
    fetch_records_per_s: float
    rebalance_ms: int
    fetch_ms: int


def parse_consumer_perf(output: str) -> ConsumerPerf:
    """The figures of ConsumerPerformance's summary, by column name: the first line after its header
    with a value for every column (a warning such as a consume timeout is printed in between)."""
    rows = [[field.strip() for field in line.split(",")] for line in output.splitlines()]
    header = next((i for i, row in enumerate(rows) if row[0] == "start.time"), len(rows))
    names = rows[header] if header < len(rows) else []
    summary = next((row for row in rows[header + 1:] if len(row) == len(names)), None)
    if summary is None:
        raise ValueError(f"no ConsumerPerformance summary in: {output[-2000:]}")
    values = dict(zip(names, summary, strict=True))
    return ConsumerPerf(records=int(values["data.consumed.in.nMsg"]), records_per_s=float(values["nMsg.sec"]),
                        fetch_records_per_s=float(values["fetch.nMsg.sec"]),
                        rebalance_ms=int(values["rebalance.time.ms"]), fetch_ms=int(values["fetch.time.ms"]))


def consumer_perf(kafka: KafkaConnection, topic: str, records: int) -> ConsumerPerf:
    """Kafka's ConsumerPerformance over the whole topic: a fresh group reading from the beginning,
    without committing (the job commits nothing either, and the group leaves nothing behind)."""
    group = f"bench-consumer-perf-{uuid.uuid4().hex[:8]}"
    result = kafka_tools.run("consumer-perf", "--bootstrap-server", kafka.bootstrap, "--topic", topic,
                             "--num-records", str(records), "--group", group,
                             "--command-property", "enable.auto.commit=false", capture=True)
    if result.returncode != 0:
        raise RuntimeError(f"ConsumerPerformance failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    figures = parse_consumer_perf(result.stdout)
    if figures.records != records:
        raise RuntimeError(f"ConsumerPerformance read {figures.records} of {records} records: "
                           f"{result.stdout[-2000:]}")
    return figures


@dataclass(frozen=True)
class Workload:
    """What the generated topic holds and how the job reads it, beside its size and layout."""

    record_size: int = 100
    skew: str = "uniform"
    keys: str = "uuid"
    hot_threshold: float = 2.0
    bucket_seconds: int = 1
    min_partitions: int | None = None
    repeat: int = 1
    keep_topic: bool = False
    distinct_keys: bool = True  # time the --distinct-keys variant beside the default job


def measure(kafka: KafkaConnection, spark: SparkSession, records: int, partitions: int = 64,
            replication: int = 1, workload: Workload = Workload()) -> dict[str, Any]:
    """Generate a fresh topic, read it with ConsumerPerformance, then time the bare scan and the
    job in the caller's Spark session (warm after the first size); check the job's counts, delete
    the topic.

    Returns the figures: `generate_s`, `job_s` (the fastest of `workload.repeat` runs, all in
    `job_runs_s`), `job_records_per_s`, `consumer_perf_records_per_s` (the best of as many
    ConsumerPerformance runs, all in `consumer_perf_runs_records_per_s`), `ratio` (job records/s
    over ConsumerPerformance's), their fetch-only counterparts and the load average around the run.
    """
    topic = f"bench-spark-load-{records}-{uuid.uuid4().hex[:8]}"
    load_before = os.getloadavg()
    try:
        started = time.perf_counter()
        counts = datagen.generate(kafka, topic, records, skew=workload.skew, keys=workload.keys,
                                  record_size=workload.record_size, partitions=partitions,
                                  replication=replication)
        generate_s = time.perf_counter() - started
        perf_runs = [consumer_perf(kafka, topic, records) for _ in range(workload.repeat)]
        perf = max(perf_runs, key=lambda run: run.records_per_s)
        read = {"min_partitions": workload.min_partitions}
        started = time.perf_counter()
        scanned = partition_load.read_records(spark, kafka, [topic], **read).count()
        scan_s = time.perf_counter() - started

        def job(distinct_keys: bool) -> tuple[float, partition_load.LoadResult]:
            started = time.perf_counter()
            result = partition_load.analyse(
                partition_load.read_records(spark, kafka, [topic], **read), {topic: partitions},
                hot_threshold=workload.hot_threshold, bucket_seconds=workload.bucket_seconds,
                partition_records={topic: [counts.get(p, 0) for p in range(partitions)]},
                distinct_keys=distinct_keys)
            return time.perf_counter() - started, result

        job_times, distinct_times = [], []
        for _ in range(workload.repeat):  # the two variants alternate: the machine's drift meets both
            seconds, result = job(False)
            job_times.append(seconds)
            if workload.distinct_keys:
                seconds, distinct = job(True)
                distinct_times.append(seconds)
    finally:
        if not workload.keep_topic:
            delete(kafka, [topic])
    got = {p["partition"]: p["records"] for p in result.partitions}
    if got != counts or scanned != records:
        raise SystemExit(f"{topic}: job counted {sum(got.values())} / scan {scanned}, generated {records}")
    job_s = min(job_times)
    job_rps = records / job_s
    (skew,) = result.skew
    figures = {"records": records, "topic": topic, "partitions": partitions, "replication": replication,
               "record_size": workload.record_size, "master": spark.sparkContext.master,
               "load_average_before": load_before,
               "load_average_after": os.getloadavg(), "generate_s": round(generate_s, 2),
               "generate_records_per_s": round(records / generate_s), "scan_s": round(scan_s, 2),
               "job_s": round(job_s, 2), "job_runs_s": [round(t, 2) for t in job_times],
               "job_records_per_s": round(job_rps),
               "consumer_perf_records_per_s": round(perf.records_per_s),
               "consumer_perf_runs_records_per_s": [round(run.records_per_s) for run in perf_runs],
               "consumer_perf_fetch_records_per_s": round(perf.fetch_records_per_s),
               "consumer_perf_rebalance_ms": perf.rebalance_ms, "consumer_perf_fetch_ms": perf.fetch_ms,
               "ratio": round(job_rps / perf.records_per_s, 3),
               "ratio_fetch_only": round(job_rps / perf.fetch_records_per_s, 3),
               "buckets": len(result.buckets), "diagnosis": skew["diagnosis"]["cause"],
               "sampled_per_partition": [min(p["sampled"] for p in result.partitions),
                                         max(p["sampled"] for p in result.partitions)],
               "skew": {k: skew[k] for k in ("max_over_mean", "cv", "gini", "hottest_share")}}
    if distinct_times:
        distinct_s = min(distinct_times)
        # uuid keys: as many distinct keys as records in every partition; the job estimates them
        figures |= {"distinct_keys_job_s": round(distinct_s, 2),
                    "distinct_keys_job_runs_s": [round(t, 2) for t in distinct_times],
                    "distinct_keys_ratio": round(records / distinct_s / perf.records_per_s, 3),
                    "distinct_keys_max_relative_error": max(
                        abs(p["distinct_keys"] - p["records"]) / p["records"]
                        for p in distinct.partitions if p["records"]) if workload.keys == "uuid" else None}
    return figures


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets and, for the run of TARGET_RECORDS records (if any), whether it met them."""
    run = next((r for r in rows if r["records"] == TARGET_RECORDS), None)
    met = None if run is None else {"job_s": run["job_s"] <= TARGET_JOB_S,
                                    "ratio": run["ratio"] >= TARGET_RATIO}
    return {"records": TARGET_RECORDS, "job_s_at_most": TARGET_JOB_S, "ratio_at_least": TARGET_RATIO,
            "met": met}


def table(rows: list[dict[str, Any]]) -> Table:
    out = Table(title="partition_load against Kafka's ConsumerPerformance, same topic "
                      "(data generation excluded from job time)")
    for name in ("records", "generate s", "bare scan s", "job s", "job rec/s", "ConsumerPerf rec/s",
                 "ratio", "distinct-keys job s", "its ratio", "load avg", "diagnosis"):
        out.add_column(name, justify="right")
    for r in rows:
        distinct = r.get("distinct_keys_job_runs_s")
        out.add_row(f"{r['records']:,}", f"{r['generate_s']:.1f}", f"{r['scan_s']:.1f}",
                    ", ".join(f"{t:.1f}" for t in r["job_runs_s"]), f"{r['job_records_per_s']:,}",
                    f"{r['consumer_perf_records_per_s']:,}", f"{r['ratio']:.3f}",
                    ", ".join(f"{t:.1f}" for t in distinct) if distinct else "-",
                    f"{r['distinct_keys_ratio']:.3f}" if distinct else "-",
                    f"{r['load_average_before'][0]:.2f}", r["diagnosis"])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kafka_connection.add_argument(parser)
    parser.add_argument("--sizes", default="1000000,10000000", help="comma-separated record counts")
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--replication", type=int, default=1)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--skew", default="uniform", help="datagen skew spec")
    parser.add_argument("--keys", default="uuid", help="datagen key mode")
    parser.add_argument("--hot-threshold", type=float, default=2.0)
    parser.add_argument("--bucket-seconds", type=int, default=1)
    parser.add_argument("--min-partitions", type=int, help="Kafka connector minPartitions")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of the job and of ConsumerPerformance per size; the best of each is "
                             "compared (the session stays warm)")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else spark.master in "
                            "$SPARK_CONF_DIR/spark-defaults.conf, else local[*])")
    parser.add_argument("--results-dir", type=Path, default=REPO / "results")
    parser.add_argument("--keep-topics", action="store_true", help="do not delete the generated topics")
    parser.add_argument("--no-distinct-keys", action="store_true",
                        help="skip the --distinct-keys variant of the job")
    args = parser.parse_args(argv)
    kafka = kafka_connection.from_args(args, parser).default
    workload = Workload(record_size=args.record_size, skew=args.skew, keys=args.keys,
                        hot_threshold=args.hot_threshold, bucket_seconds=args.bucket_seconds,
                        min_partitions=args.min_partitions, repeat=args.repeat, keep_topic=args.keep_topics,
                        distinct_keys=not args.no_distinct_keys)

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    console = Console()
    rows = []
    with session(APP_NAME, args.master, long_scan=True) as spark:
        for size in (int(s) for s in args.sizes.split(",")):
            rows.append(measure(kafka, spark, size, args.partitions, args.replication, workload))
            console.print(table(rows))
    goals = targets(rows)
    console.print(f"targets at {goals['records']:,} records: job <= {goals['job_s_at_most']} s, "
                  f"ratio >= {goals['ratio_at_least']}; met: {goals['met']}")
    out_dir = args.results_dir / f"spark-bench-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {"started_at": stamp, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
               "targets": goals, "runs": rows}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"summary: {out_dir / 'summary.json'}")


if __name__ == "__main__":
    main()
