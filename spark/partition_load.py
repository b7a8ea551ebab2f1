"""Load and skew per Kafka partition, and why, read in batch through the Spark Kafka connector.

Per topic and partition: records, bytes (key + value lengths), keyless records, the most frequent
keys of a sample taken in the same pass (measure.skew sizes it), records per time bucket (record
timestamps), whether the partition is hot (records > threshold x the topic's mean) and, with
`--distinct-keys`, its distinct keys (a sketch's estimate). Per topic, the skew over all
partitions, empty ones included (partition counts come from the broker's metadata, or
`--partitions`): max/mean, coefficient of variation, Gini coefficient and the hottest partition's
share, as measure.figures defines them, and its diagnosis (measure.skew.diagnose): hot key,
keyless records on a sticky partitioner, too few partitions for the rate, hashing noise or balanced.

Only topic, partition, offset, key, key + value length and timestamp leave the scan, and only the
aggregates reach the driver, so ten million records never cross into Python.

Run it as `python -m spark.partition_load ...` or
`PYSPARK_PYTHON=.venv/bin/python spark-submit --jars $SPARK_JARS spark/partition_load.py ...`.
spark-submit puts only the script's folder on sys.path, so when run as a file the script
replaces that entry with the repository root before importing the project. That is enough
because the jobs use DataFrame expressions only: no project code runs in the executors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: import the project from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from psycopg2.extras import Json
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from consumers.config import kafka_connection
from consumers.config.kafka_connection import KafkaConnection
from measure import figures, skew
from measure.sizing import SizingInput, size
from spark import job_io
from spark.session import job_session

RECORD_COLUMNS = ("topic", "partition", "offset", "bytes", "key", "ts_ms")
# A record's place in [0, 1) for the key sample: the low 53 bits of a hash, as a double holds them.
UNIFORM_MASK = (1 << 53) - 1
# DataSketches HLL of the keys (--distinct-keys): a hashed coupon per key up to about 196k
# distinct keys per partition, beyond that 2^21 registers (a relative standard error of about
# 0.07 %); at most 2 MiB a sketch.
KEY_SKETCH_LG_K = 21
# The scan's Kafka consumer settings; each task's consumer reads one partition (the figures
# behind them: docs/analysis.md, "Speed against Kafka's own consumer"):
# - fetch.max.wait.ms 10: each consumer otherwise ends on a fetch the broker holds for the full
#   wait at the log end, per partition;
# - max.poll.records 10,000 and max.partition.fetch.bytes 8 MiB: the connector seeks and asks the
#   broker for the partition's offsets after every poll, so the scan's cost follows its polls;
# - receive.buffer.bytes 2 MiB, as Kafka's ConsumerPerformance sets it;
# - no JMX reporter, no client-metrics push: every task builds a consumer, and both cost it CPU
#   time for figures nobody reads;
# - read_committed, as the platform's consumers: a stage with exactly-once outputs leaves the
#   records of its aborted transactions in its topics, which no reader of them may count.
SCAN_CONSUMER = {
    "isolation.level": "read_committed",
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
        "topic", "partition", "offset",
        (F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))).alias("bytes"),
        "key",
        F.unix_millis("timestamp").alias("ts_ms"),
    )


def in_sample(rate: Column | None) -> Column:
    """Whether a record is in the key sample: kept with probability `rate` (its partition's, see
    measure.skew.sample_rate), decided by a hash of its partition and offset, so a rerun samples
    the same records and a key's records are not kept or dropped together; all of them without a
    rate."""
    if rate is None:
        return F.lit(True)
    uniform = F.xxhash64("partition", "offset").bitwiseAND(F.lit(UNIFORM_MASK)) / float(UNIFORM_MASK + 1)
    return uniform < rate


def bucket_aggregates(records: DataFrame, bucket_seconds: int, *, sample_rate: Column | None = None,
                      distinct_keys: bool = False) -> DataFrame:
    """Records, bytes, keyless records and sampled records per topic, partition, time bucket
    (epoch-aligned, start in epoch seconds) and `sample_key`: the key of a sampled keyed record,
    null for every other record. The one aggregation the scan feeds: the sample costs a
    group per sampled key beside the bucket's own, and no second read. With `distinct_keys`, a
    sketch of the keys as well, which takes the aggregation off generated code."""
    bucket_ms = bucket_seconds * 1000
    start = (F.floor(F.col("ts_ms") / bucket_ms) * bucket_seconds).cast("long")
    rows = records.select("topic", "partition", start.alias("bucket_start"), "bytes", "key",
                          in_sample(sample_rate).alias("sampled"))
    sample_key = F.when(F.col("sampled") & F.col("key").isNotNull(), F.col("key"))
    aggregates = [F.count(F.lit(1)).alias("records"), F.sum("bytes").alias("bytes"),
                  F.count(F.when(F.col("key").isNull(), 1)).alias("keyless"),
                  F.count(F.when(F.col("sampled"), 1)).alias("sampled")]
    if distinct_keys:
        aggregates.append(F.hll_sketch_agg("key", KEY_SKETCH_LG_K).alias("keys"))
    return rows.groupBy("topic", "partition", "bucket_start", sample_key.alias("sample_key")).agg(*aggregates)


def partition_aggregates(buckets: DataFrame, *, distinct_keys: bool = False) -> DataFrame:
    """Per topic and partition: records, bytes, keyless and sampled records, its buckets' starts
    and records as two arrays in time order, its TOP_KEYS most frequent sampled keys (`top_keys`:
    key and sampled records) and, with `distinct_keys`, the merged sketches' estimate (a key seen
    in several buckets counts once).

    The bucket aggregates are summed once per bucket and once per sampled key (grouping sets over
    their few rows), then per partition: one chain of aggregations over one read. Two branches
    joined instead read the topic twice: each is optimised on its own (a filter pushed down,
    unused sums pruned), so Spark finds no common shuffle to reuse. Two arrays of numbers rather
    than one of structs: they reach Python and become dicts faster (docs/analysis.md)."""
    names = ("records", "bytes", "keyless", "sampled")
    regrouped = buckets.groupingSets(
        [["topic", "partition", "bucket_start"], ["topic", "partition", "sample_key"]],
        "topic", "partition", "bucket_start", "sample_key",
    ).agg(*(F.sum(n).alias(n) for n in names), F.grouping("sample_key").alias("per_bucket"),
          *([F.hll_union_agg("keys").alias("keys")] if distinct_keys else []))
    per_bucket = F.col("per_bucket") == 1
    keyed = ~per_bucket & F.col("sample_key").isNotNull()
    in_order = F.array_sort(F.collect_list(F.when(per_bucket, F.struct("bucket_start", "records"))))
    most_first = F.array_sort(F.collect_list(F.when(keyed, F.struct((-F.col("records")).alias("minus_n"),
                                                                    F.col("sample_key").alias("key")))))
    distinct = (F.hll_sketch_estimate(F.hll_union_agg(F.when(per_bucket, F.col("keys")))) if distinct_keys
                else F.lit(None).cast("long")).alias("distinct_keys")
    return regrouped.groupBy("topic", "partition").agg(
        *(F.sum(F.when(per_bucket, F.col(n))).alias(n) for n in names), distinct,
        in_order.alias("buckets"), F.slice(most_first, 1, skew.TOP_KEYS).alias("top"),
    ).select(
        "topic", "partition", *names, "distinct_keys",
        F.col("buckets.bucket_start").alias("bucket_starts"),
        F.col("buckets.records").alias("bucket_records"),
        F.transform("top", lambda k: F.struct(k["key"].alias("key"), (-k["minus_n"]).alias("sampled")))
        .alias("top_keys"))


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


def sample_rates(topics: list[str], partition_records: Mapping[str, Sequence[int]]) -> Column | None:
    """Each record's partition's sample rate (measure.skew.sample_rate for its records before
    the read), by topic id and partition; None when every partition is sampled whole."""
    sample = skew.key_sample_size()["records"]
    rates = [[skew.sample_rate(n, sample) for n in partition_records.get(t, [])] for t in topics]
    if all(r == 1.0 for per_topic in rates for r in per_topic):
        return None
    table = F.array(*(F.array(*(F.lit(r) for r in per_topic)) if per_topic
                      else F.array().cast("array<double>") for per_topic in rates))
    return F.coalesce(F.try_element_at(F.try_element_at(table, F.col("topic")), F.col("partition") + 1),
                      F.lit(1.0))


def key_text(key: bytes) -> str:
    """A key as the report shows it: its text when it is printable UTF-8 (request ids, UUIDs as
    text), else `0x` and its bytes in hex (the runtime's 16-byte binary UUIDs)."""
    try:
        text = bytes(key).decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return text if text is not None and text.isprintable() else "0x" + bytes(key).hex()


def analyse(records: DataFrame, partitions: dict[str, int], *, hot_threshold: float = 2.0,
            bucket_seconds: int = 1, partition_records: Mapping[str, Sequence[int]] | None = None,
            distinct_keys: bool = False, sizing: Mapping[str, Mapping[str, Any]] | None = None) -> LoadResult:
    """Compute and collect every figure over the topics of `partitions`; only the small
    aggregates reach the driver.

    The scan feeds one aggregation, per (topic, partition, time bucket, sampled key), whose few
    rows are summed per partition in the same query: one Spark action, no record shuffled or
    kept. The key sample keeps each record with its partition's rate, from `partition_records`
    (records per partition before the read, as the broker's offsets give them); without it every
    keyed record is sampled, exact and only for small inputs. The skew figures and the diagnosis
    come from the collected counts, with measure.figures and measure.skew like every other
    consumer of them, over every partition of `partitions` (those nobody wrote to count as
    empty); `sizing` (measure.sizing.size per topic) lets a topic be found short of partitions.
    The topic is an id (topic_ids) until the aggregates are named again, so the aggregation
    hashes an int instead of the name. Distinct keys, on request, come from a DataSketches HLL
    sketch per bucket (KEY_SKETCH_LG_K): its cost is in docs/analysis.md.
    """
    topics = list(partitions)
    rate = sample_rates(topics, partition_records) if partition_records is not None else None
    buckets = bucket_aggregates(topic_ids(records.select(*RECORD_COLUMNS), topics), bucket_seconds,
                                sample_rate=rate, distinct_keys=distinct_keys)
    aggregates = partition_aggregates(buckets, distinct_keys=distinct_keys)
    read = {(row["topic"], row["partition"]): row.asDict(recursive=True)
            for row in topic_names(aggregates, topics).collect()}
    empty = {"records": 0, "bytes": 0, "keyless": 0, "sampled": 0, "bucket_starts": [], "bucket_records": [],
             "distinct_keys": 0 if distinct_keys else None, "top_keys": None}
    per_partition: list[dict[str, Any]] = []
    per_topic: list[dict[str, Any]] = []
    per_bucket: list[dict[str, Any]] = []
    for topic in sorted(partitions):
        rows = [read.get((topic, p), empty) for p in range(partitions[topic])]
        counts = [row["records"] for row in rows]
        total = sum(counts)
        keys = [skew.top_keys([(key_text(k["key"]), k["sampled"]) for k in row["top_keys"] or []],
                              row["sampled"], row["records"], total) for row in rows]
        hot = figures.hot_partitions(counts, hot_threshold)
        for p, row in enumerate(rows):
            per_partition.append({"topic": topic, "partition": p,
                                  **{name: row[name] for name in ("records", "bytes", "keyless", "sampled",
                                                                  "distinct_keys")},
                                  "top_keys": keys[p], "hot": p in hot})
            starts_and_counts = zip(row["bucket_starts"], row["bucket_records"], strict=True)
            per_bucket.extend({"topic": topic, "partition": p, "bucket_start": start, "records": count}
                              for start, count in starts_and_counts)
        hottest_partition, hottest_share = figures.hottest(counts)
        max_over_mean, cv = figures.skew(counts)
        diagnosis = skew.diagnose(counts, [row["keyless"] for row in rows],
                                  keys[hottest_partition] if hottest_partition is not None else [],
                                  hot_threshold=hot_threshold, sizing=(sizing or {}).get(topic))
        per_topic.append({"topic": topic, "partitions": len(counts), "records": total,
                          "hottest_partition": hottest_partition, "gini": figures.gini(counts),
                          "hottest_share": hottest_share, "max_over_mean": max_over_mean, "cv": cv,
                          "hot_partitions": hot, "diagnosis": diagnosis})
    return LoadResult(per_partition, per_topic, per_bucket)


def store(database_url: str, run_id: str, result: LoadResult, hot_threshold: float) -> None:
    """Replace this run's rows for each topic in the analysis tables."""
    for topic in result.skew:
        name = topic["topic"]
        scope = {"run_id": run_id, "topic": name}
        job_io.replace_rows(
            database_url, "analysis_partition_load", scope,
            ["kafka_partition", "records", "bytes", "distinct_keys", "hot", "keyless", "sampled", "top_keys"],
            [(p["partition"], p["records"], p["bytes"], p["distinct_keys"], p["hot"], p["keyless"],
              p["sampled"], Json(p["top_keys"])) for p in result.partitions if p["topic"] == name])
        diagnosis = topic["diagnosis"]
        job_io.replace_rows(
            database_url, "analysis_skew", scope,
            ["partitions", "records", "max_over_mean", "cv", "gini", "hottest_share", "hottest_partition",
             "hot_partitions", "hot_threshold", "diagnosis", "recommendation", "diagnosis_figures"],
            [(topic["partitions"], topic["records"], topic["max_over_mean"], topic["cv"], topic["gini"],
              topic["hottest_share"], topic["hottest_partition"], topic["hot_partitions"], hot_threshold,
              diagnosis["cause"], diagnosis["recommendation"], Json(diagnosis["figures"]))])
        job_io.replace_rows(
            database_url, "analysis_partition_buckets", scope,
            ["kafka_partition", "bucket_start", "records"],
            [(b["partition"], job_io.utc_iso(b["bucket_start"]), b["records"])
             for b in result.buckets if b["topic"] == name])


def sizing_of(text: str | None, partitions: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """measure.sizing.size per topic from `--sizing-json` (topic -> SizingInput fields, the
    topic's partition count added as its current one)."""
    if not text:
        return {}
    given = json.loads(Path(text).read_text() if not text.lstrip().startswith("{") else text)
    unknown = set(given) - set(partitions)
    if unknown:
        raise SystemExit(f"--sizing-json names topics the job does not read: {', '.join(sorted(unknown))}")
    try:
        return {t: size(SizingInput(**{**inputs, "current_partitions": partitions[t]}))
                for t, inputs in given.items()}
    except (TypeError, ValueError) as err:
        raise SystemExit(f"--sizing-json: {err}") from None


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
    parser.add_argument("--distinct-keys", action="store_true",
                        help="also count distinct keys per partition (a DataSketches HLL sketch per time "
                             "bucket). Off by default: it takes the aggregation off generated code, "
                             "which makes the job slower (docs/analysis.md, \"Speed against Kafka's "
                             "own consumer\")")
    parser.add_argument("--sizing-json",
                        help="JSON object (or a file holding one): topic -> the partition-sizing inputs "
                             "for the rate it must carry (target, produce_per_partition, and "
                             "consume_per_partition or concurrency_per_partition and service_time_s, as "
                             "measure/sizing.py takes them); an evenly loaded topic with fewer "
                             "partitions than the formula asks for is diagnosed too_few_partitions")
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
    sizing = sizing_of(args.sizing_json, partitions)
    with job_session("partition-load", args.master, remote_url=args.remote) as spark:
        records = read_records(spark, args.kafka, args.topics, start_ms=args.start_ms,
                               end_ms=args.end_ms, min_partitions=args.min_partitions)
        result = analyse(records, partitions, hot_threshold=args.hot_threshold,
                         bucket_seconds=args.bucket_seconds, partition_records=counts,
                         distinct_keys=args.distinct_keys, sizing=sizing)
    document = result.document(run_id, topics=args.topics, start_ms=args.start_ms, end_ms=args.end_ms,
                               bucket_seconds=args.bucket_seconds, hot_threshold=args.hot_threshold,
                               distinct_keys=args.distinct_keys, key_sample=skew.key_sample_size())
    job_io.write_json(args.output_json, document)
    if args.database_url:
        store(args.database_url, run_id, result, args.hot_threshold)
    for topic in result.skew:
        print(f"{topic['topic']}: {topic['records']} records over {topic['partitions']} partitions, "
              f"max/mean {topic['max_over_mean']}, cv {topic['cv']}, gini {topic['gini']}, "
              f"hot {topic['hot_partitions']}; {topic['diagnosis']['cause']}: "
              f"{topic['diagnosis']['recommendation']}")
    return document


if __name__ == "__main__":
    main()
