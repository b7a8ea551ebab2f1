"""Benchmark: how long `partition_load` takes over 1M and 10M records (not a test).

Each size gets a fresh topic filled by the data generator (100-byte values, 64 partitions by
default); the job is then timed in one reused Spark session, data generation excluded. A bare
scan (the Kafka read alone, counted) is timed too, to show how much of the job is the read.
The job's per-partition totals are checked against the generator's counts, so a fast wrong
answer cannot pass. Results: a table on the console and results/spark-bench-<UTC time>/summary.json.

    python -m bench.spark_partition_load --sizes 1000000,10000000
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from consumers import datagen, kafka_connection
from consumers.kafka_connection import KafkaConnection
from consumers.provisioning import delete
from spark import partition_load
from spark.session import build

REPO = Path(__file__).resolve().parent.parent


def bench_size(spark: Any, kafka: KafkaConnection, size: int, args: argparse.Namespace,
               stamp: str) -> dict[str, Any]:
    """Generate one topic, time the bare scan and the job, check the job's counts."""
    topic = f"bench-spark-load-{size}-{stamp.lower()}"
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    counts = datagen.generate(kafka, topic, size, skew=args.skew, keys=args.keys,
                              record_size=args.record_size, partitions=args.partitions,
                              replication=args.replication)
    generate_s = time.perf_counter() - started
    read = {"min_partitions": args.min_partitions}

    started = time.perf_counter()
    scanned = partition_load.read_records(spark, kafka, [topic], **read).count()
    scan_s = time.perf_counter() - started

    job_times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        result = partition_load.analyse(partition_load.read_records(spark, kafka, [topic], **read),
                                        {topic: args.partitions}, hot_threshold=args.hot_threshold,
                                        bucket_seconds=args.bucket_seconds)
        job_times.append(time.perf_counter() - started)
    got = {p["partition"]: p["records"] for p in result.partitions}
    if got != counts or scanned != size:
        raise SystemExit(f"{topic}: job counted {sum(got.values())} / scan {scanned}, generated {size}")
    if not args.keep_topics:
        delete(kafka, [topic])
    (skew,) = result.skew
    return {"records": size, "topic": topic, "partitions": args.partitions, "record_size": args.record_size,
            "load_average_before": load_before, "generate_s": round(generate_s, 2),
            "generate_records_per_s": round(size / generate_s),
            "scan_s": round(scan_s, 2), "job_s": [round(t, 2) for t in job_times],
            "job_records_per_s": round(size / min(job_times)), "buckets": len(result.buckets),
            "skew": {k: skew[k] for k in ("max_over_mean", "cv", "gini", "hottest_share")}}


def table(rows: list[dict[str, Any]]) -> Table:
    out = Table(title="partition_load over Kafka (data generation excluded from job time)")
    for name in ("records", "generate s", "generate rec/s", "bare scan s", "job s", "job rec/s", "cv"):
        out.add_column(name, justify="right")
    for r in rows:
        out.add_row(f"{r['records']:,}", f"{r['generate_s']:.1f}", f"{r['generate_records_per_s']:,}",
                    f"{r['scan_s']:.1f}", ", ".join(f"{t:.1f}" for t in r["job_s"]),
                    f"{r['job_records_per_s']:,}", f"{r['skew']['cv']:.4f}")
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
    parser.add_argument("--repeat", type=int, default=1, help="job runs per size (the session stays warm)")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else spark.master in "
                            "$SPARK_CONF_DIR/spark-defaults.conf, else local[*])")
    parser.add_argument("--results-dir", type=Path, default=REPO / "results")
    parser.add_argument("--keep-topics", action="store_true", help="do not delete the generated topics")
    args = parser.parse_args(argv)
    kafka = kafka_connection.from_args(args, parser).default

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    console = Console()
    session_started = time.perf_counter()
    spark = build("bench-partition-load", args.master)
    session_s = time.perf_counter() - session_started
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        rows.append(bench_size(spark, kafka, size, args, stamp))
        console.print(table(rows))
    out_dir = args.results_dir / f"spark-bench-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {"started_at": stamp, "cpus": os.cpu_count(), "master": spark.sparkContext.master,
               "session_start_s": round(session_s, 2), "load_average": os.getloadavg(), "runs": rows}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"summary: {out_dir / 'summary.json'}")


if __name__ == "__main__":
    main()
