"""Load and skew per Kafka partition, read in batch through the Spark Kafka connector.

Per topic and partition: records, bytes (key + value lengths), distinct keys (a sketch's
estimate, see `analyse`), records per time
bucket (record timestamps), and whether the partition is hot (records > threshold x the
topic's mean). Per topic, the skew over all partitions, empty ones included (partition counts
come from the broker's metadata, or `--partitions`): max/mean, coefficient of variation, Gini
coefficient and the hottest partition's share, as measure.figures defines them.

Only topic, partition, key, key + value length and timestamp leave the scan, and only the
aggregates reach the driver, so ten million records never cross into Python.

Run it as `python -m spark.partition_load ...` or
`PYSPARK_PYTHON=.venv/bin/python spark-submit --jars $SPARK_JARS spark/partition_load.py ...`.
spark-submit puts only the script's folder on sys.path, so when run as a file the script
replaces that entry with the repository root before importing the project. That is enough
because the jobs use DataFrame expressions only: no project code runs in the executors.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: import the project from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from consumers import kafka_connection
from consumers.kafka_connection import KafkaConnection
from measure import figures
from spark import job_io
from spark.session import build

RECORD_COLUMNS = ("topic", "partition", "bytes", "key", "ts_ms")
# DataSketches HLL of the keys: a hashed coupon per key up to about 196k distinct keys per
# partition (30k counted exactly in a test, 10M uuid keys over 64 partitions within 0.02 %),
# beyond that 2^21 registers, a relative standard error of about 0.07 %; at most 2 MiB a sketch.
KEY_SKETCH_LG_K = 21
# The scan's Kafka consumer settings (each task's consumer reads one partition; ten million
# 100-byte records over 64 partitions, warm session, measured here):
# - fetch.max.wait.ms 500 -> 10: each consumer otherwise ends on a fetch the broker holds for the
#   full wait at the log end, 0.5 s per partition (2-3x the scan time).
# - max.poll.records 500 -> 10,000 and max.partition.fetch.bytes 1 -> 8 MiB: after every poll the
#   connector seeks and asks the broker for the partition's earliest and latest offsets, so the
#   scan's cost follows its number of polls; a poll now takes what one fetch brings. Bare scan
#   median 7.8 s at 2,000 records a poll with 8 MiB fetches, 6.0 s at 10,000 (20,000 no better),
#   8.0 s at 10,000 with 1 MiB fetches. The connector keeps each partition's last poll after its
#   task ends (about 4,300 records a partition here, some 60 MiB a query), which
#   spark/session.py lets go sooner.
# - receive.buffer.bytes 64 KiB -> 2 MiB, as Kafka's ConsumerPerformance sets it.
# - no JMX reporter, no client-metrics push: every task builds a consumer, and registering its
#   metrics as MBeans and asking the broker for a telemetry subscription cost each one CPU
#   time for figures nobody reads (median 9.4 -> 8.5 s at 2,000 records a poll).
SCAN_CONSUMER = {
    "fetch.max.wait.ms": "10",
    "max.poll.records": "10000",
    "max.partition.fetch.bytes": str(8 << 20),
    "receive.buffer.bytes": str(2 << 20),
    "auto.include.jmx.reporter": "false",
    "enable.metrics.push": "false",
}


def read_records(spark: SparkSession, kafka: KafkaConnection, topics: list[str], *,
                 start_ms: int | None = None, end_ms: int | None = None,
                 min_partitions: int | None = None) -> DataFrame:
    """The topics' records in batch: earliest to latest offsets, or a [start, end) time window.

    A time window is resolved to offsets by the broker (first offset at or after a timestamp);
    since CreateTime need not grow with the offset, records outside the window are also
    filtered out. A partition with nothing after `start_ms` starts at its end instead of failing.

    The connection's settings (security included) and SCAN_CONSUMER become the source's `kafka.`
    options.
    """
    reader = (spark.read.format("kafka")
              .options(**kafka.spark_options())
              .options(**{f"kafka.{name}": value for name, value in SCAN_CONSUMER.items()})
              .option("subscribe", ",".join(topics)))
    if start_ms is None:
        reader = reader.option("startingOffsets", "earliest")
    else:
        reader = (reader.option("startingTimestamp", str(start_ms))
                  .option("startingOffsetsByTimestampStrategy", "latest"))
    if end_ms is None:
        reader = reader.option("endingOffsets", "latest")
    else:
        reader = reader.option("endingTimestamp", str(end_ms))
    if min_partitions:
        reader = reader.option("minPartitions", str(min_partitions))
    records = project(reader.load())
    if start_ms is not None:
        records = records.where(F.col("ts_ms") >= start_ms)
    if end_ms is not None:
        records = records.where(F.col("ts_ms") < end_ms)
    return records


def project(kafka_frame: DataFrame) -> DataFrame:
    """Only the columns the figures need: bytes = key + value lengths (null counts as 0)."""
    return kafka_frame.select(
        "topic", "partition",
        (F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))).alias("bytes"),
        "key",
        F.unix_millis("timestamp").alias("ts_ms"),
    )


def bucket_aggregates(records: DataFrame, bucket_seconds: int) -> DataFrame:
    """Records, bytes and a sketch of the distinct (non-null) keys per topic, partition and time
    bucket (epoch-aligned, start in epoch seconds): the one aggregation the scan feeds."""
    bucket_ms = bucket_seconds * 1000
    start = (F.floor(F.col("ts_ms") / bucket_ms) * bucket_seconds).cast("long")
    return records.groupBy("topic", "partition", start.alias("bucket_start")).agg(
        F.count(F.lit(1)).alias("records"),
        F.sum("bytes").alias("bytes"),
        F.hll_sketch_agg("key", KEY_SKETCH_LG_K).alias("keys"),
    )


def partition_aggregates(buckets: DataFrame) -> DataFrame:
    """Records, bytes and distinct keys per topic and partition, from its buckets' aggregates
    (the key sketches merged, so a key seen in several buckets counts once), and its buckets'
    starts and records as two arrays in time order. Two arrays of numbers rather than one of
    structs: 230,000 buckets (an hour of 1 s buckets over 64 partitions) reached Python in
    4.3-5.2 s instead of 5.4-6.6 s, and became dicts in 0.05 s instead of 0.6-1.0 s."""
    in_order = F.array_sort(F.collect_list(F.struct("bucket_start", "records")))
    return buckets.groupBy("topic", "partition").agg(
        F.sum("records").alias("records"),
        F.sum("bytes").alias("bytes"),
        F.hll_sketch_estimate(F.hll_union_agg("keys")).alias("distinct_keys"),
        in_order.alias("buckets"),
    ).select("topic", "partition", "records", "bytes", "distinct_keys",
             F.col("buckets.bucket_start").alias("bucket_starts"),
             F.col("buckets.records").alias("bucket_records"))


@dataclass
class LoadResult:
    """The collected figures: one dict per partition, per topic and per (partition, bucket)."""

    partitions: list[dict[str, Any]]
    skew: list[dict[str, Any]]
    buckets: list[dict[str, Any]]

    def document(self, run_id: str, **params: Any) -> dict[str, Any]:
        buckets = [{**b, "bucket_start": job_io.utc_iso(b["bucket_start"])} for b in self.buckets]
        return {"run_id": run_id, "params": params, "partitions": self.partitions, "skew": self.skew,
                "buckets": buckets}


def topic_ids(records: DataFrame, topics: list[str]) -> DataFrame:
    """`topic` as its 1-based position in `topics`, a 4-byte int instead of a name tens of bytes
    long in every record; records of other topics are left out."""
    ids = F.array_position(_names(topics), F.col("topic")).cast("int")
    return records.withColumn("topic", ids).where(F.col("topic") > 0)


def topic_names(frame: DataFrame, topics: list[str]) -> DataFrame:
    """`topic` back from its position in `topics` (see topic_ids) to its name."""
    return frame.withColumn("topic", F.element_at(_names(topics), F.col("topic")))


def _names(topics: list[str]) -> Any:
    return F.array(*(F.lit(t) for t in topics))


def analyse(records: DataFrame, partitions: dict[str, int], *, hot_threshold: float = 2.0,
            bucket_seconds: int = 1) -> LoadResult:
    """Compute and collect every figure over the topics of `partitions`; only the small
    aggregates reach the driver.

    The scan feeds one aggregation, per (topic, partition, time bucket), whose few rows
    (partitions x buckets) are summed per partition, their key sketches merged, in the same
    query: one Spark action, no record shuffled or kept. The skew figures come from the
    collected counts, with measure.figures like every other consumer of them, over every
    partition of `partitions` (those nobody wrote to count as empty). Distinct keys come from a
    DataSketches HLL sketch per bucket (KEY_SKETCH_LG_K). Measured here on 10M records: keeping
    the records instead (hash-partitioned by key, persisted) and counting them exactly cost 45 s
    against 11.5-18.9 s with the sketch at the time; collecting the totals, the skew and the
    buckets in separate queries from a cached aggregation cost 1-1.5 s more than this one. On
    2M records over 10 s and over an hour of 1 s buckets, one aggregation over grouping sets
    (per bucket and per partition, the sketch only in the latter) was no faster: it feeds every
    record through the aggregation twice. The topic is an id (topic_ids) until the aggregates
    are named again, so the aggregation hashes an int instead of the name.
    """
    topics = list(partitions)
    buckets = bucket_aggregates(topic_ids(records.select(*RECORD_COLUMNS), topics), bucket_seconds)
    read = {(row["topic"], row["partition"]): row.asDict()
            for row in topic_names(partition_aggregates(buckets), topics).collect()}
    empty = {"records": 0, "bytes": 0, "distinct_keys": 0, "bucket_starts": [], "bucket_records": []}
    per_partition: list[dict[str, Any]] = []
    per_topic: list[dict[str, Any]] = []
    per_bucket: list[dict[str, Any]] = []
    for topic in sorted(partitions):
        rows = [read.get((topic, p), empty) for p in range(partitions[topic])]
        counts = [row["records"] for row in rows]
        hot = figures.hot_partitions(counts, hot_threshold)
        for p, row in enumerate(rows):
            per_partition.append({"topic": topic, "partition": p,
                                  **{name: row[name] for name in ("records", "bytes", "distinct_keys")},
                                  "hot": p in hot})
            starts_and_counts = zip(row["bucket_starts"], row["bucket_records"], strict=True)
            per_bucket.extend({"topic": topic, "partition": p, "bucket_start": start, "records": count}
                              for start, count in starts_and_counts)
        hottest_partition, hottest_share = figures.hottest(counts)
        max_over_mean, cv = figures.skew(counts)
        per_topic.append({"topic": topic, "partitions": len(counts), "records": sum(counts),
                          "hottest_partition": hottest_partition, "gini": figures.gini(counts),
                          "hottest_share": hottest_share, "max_over_mean": max_over_mean, "cv": cv,
                          "hot_partitions": hot})
    return LoadResult(per_partition, per_topic, per_bucket)


def store(database_url: str, run_id: str, result: LoadResult, hot_threshold: float) -> None:
    """Replace this run's rows for each topic in the analysis tables."""
    for topic in result.skew:
        name = topic["topic"]
        scope = {"run_id": run_id, "topic": name}
        job_io.replace_rows(
            database_url, "analysis_partition_load", scope,
            ["kafka_partition", "records", "bytes", "distinct_keys", "hot"],
            [(p["partition"], p["records"], p["bytes"], p["distinct_keys"], p["hot"])
             for p in result.partitions if p["topic"] == name])
        job_io.replace_rows(
            database_url, "analysis_skew", scope,
            ["partitions", "records", "max_over_mean", "cv", "gini", "hottest_share", "hottest_partition",
             "hot_partitions", "hot_threshold"],
            [(topic["partitions"], topic["records"], topic["max_over_mean"], topic["cv"], topic["gini"],
              topic["hottest_share"], topic["hottest_partition"], topic["hot_partitions"], hot_threshold)])
        job_io.replace_rows(
            database_url, "analysis_partition_buckets", scope,
            ["kafka_partition", "bucket_start", "records"],
            [(b["partition"], job_io.utc_iso(b["bucket_start"]), b["records"])
             for b in result.buckets if b["topic"] == name])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    job_io.add_common_args(parser, kafka=True)
    parser.add_argument("--start-ms", type=int, help="window start, epoch ms (default: earliest offsets)")
    parser.add_argument("--end-ms", type=int, help="window end, epoch ms, exclusive (default: latest)")
    parser.add_argument("--bucket-seconds", type=int, default=1, help="time bucket length (default 1)")
    parser.add_argument("--hot-threshold", type=float, default=2.0,
                        help="hot when records > threshold x mean (default 2.0)")
    parser.add_argument("--partitions", type=int,
                        help="partition count of every topic (default: from the cluster metadata)")
    parser.add_argument("--min-partitions", type=int, help="Kafka connector minPartitions (Spark tasks)")
    args = parser.parse_args(argv)
    args.kafka = kafka_connection.from_args(args, parser).default
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    run_id = args.run_id or job_io.default_run_id("load")
    try:  # partitions nobody wrote to still count
        counts = {t: args.kafka.partition_counts(t) for t in args.topics}
    except LookupError as unknown:
        raise SystemExit(f"unknown topic: {unknown}") from None
    partitions = {t: args.partitions or len(c) for t, c in counts.items()}
    spark = build("partition-load", args.master)
    records = read_records(spark, args.kafka, args.topics, start_ms=args.start_ms,
                           end_ms=args.end_ms, min_partitions=args.min_partitions)
    result = analyse(records, partitions, hot_threshold=args.hot_threshold,
                     bucket_seconds=args.bucket_seconds)
    document = result.document(run_id, topics=args.topics, start_ms=args.start_ms, end_ms=args.end_ms,
                               bucket_seconds=args.bucket_seconds, hot_threshold=args.hot_threshold)
    job_io.write_json(args.output_json, document)
    if args.database_url:
        store(args.database_url, run_id, result, args.hot_threshold)
    for topic in result.skew:
        print(f"{topic['topic']}: {topic['records']} records over {topic['partitions']} partitions, "
              f"max/mean {topic['max_over_mean']}, cv {topic['cv']}, gini {topic['gini']}, "
              f"hot {topic['hot_partitions']}")
    return document


if __name__ == "__main__":
    main()
