"""Figures of one pipeline run from its records in PostgreSQL (read through JDBC).

Definitions, so every figure can be recomputed in SQL:

- completions: `stage_results` rows (any outcome: the stage finished with the request) per
  stage and per epoch-aligned bucket of `--bucket-seconds`; the final stage (`generate`)
  gives the pipeline's throughput, `completed_per_s` = its rows / (last final completion -
  first `requests.produced_at`).
- latency percentiles p50/p95/p99, exact, with linear interpolation between the two closest
  ranks (Spark `percentile` = PostgreSQL `percentile_cont`): end to end from
  `requests.produced_at` to `generated_at` and to `notified_at` (requests with both ends), and
  per stage from `ai_attempts` with outcome 'ok' (`ended_at - started_at`).
- member load: AI call attempts per group member (all outcomes, and 'ok' ones).
- duplicate AI calls: 'ok' attempts, and 'started' ones never ended (a crash during the call),
  beyond the first per (request_id, stage).
- rebalance windows: each 'revoke' or 'lost' event opens a window in its consumer group that
  closes at the group's first 'assign' event at or after it (or at the run's last recorded
  instant, completion or rebalance event, when none follows); overlapping windows of one group
  merge. A window's cost is the idle time it caused at bucket resolution: the number of
  buckets the window touches (from the one holding its start to the one holding its end) in
  which no final-stage completion happened, times `--bucket-seconds`.

Runs as `python -m spark.pipeline_analysis` or `spark-submit spark/pipeline_analysis.py`
(see spark/partition_load.py for how the script finds the project).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: import the project from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark import job_io
from spark.session import build

QUANTILES = (0.5, 0.95, 0.99)
OPENING_EVENTS = ("revoke", "lost")


@dataclass(frozen=True)
class RunFrames:
    """One run's rows, timestamps kept as timestamps."""

    requests: DataFrame
    stage_results: DataFrame
    attempts: DataFrame
    rebalances: DataFrame

    def cache(self) -> RunFrames:
        return RunFrames(*(frame.cache() for frame in
                           (self.requests, self.stage_results, self.attempts, self.rebalances)))


def load_run(spark: SparkSession, jdbc: job_io.Jdbc, run_id: str) -> RunFrames:
    """The run's rows, filtered by run_id inside PostgreSQL (the `query` option)."""
    where = f"WHERE run_id = {job_io.sql_literal(run_id)}"

    def query(columns: str, table: str) -> DataFrame:
        return job_io.read_query(spark, jdbc, f"SELECT {columns} FROM {table} {where}")

    return RunFrames(
        query("request_id, produced_at, generated_at, notified_at", "requests"),
        query("request_id, stage, outcome, member, completed_at", "stage_results"),
        query("request_id, stage, member, outcome, started_at, ended_at", "ai_attempts"),
        query("group_id, member, event, at", "rebalance_events"),
    )


def _micros(name: str) -> Column:
    return F.unix_micros(F.col(name))


def _bucket(name: str, bucket_seconds: int) -> Column:
    """Index of the epoch-aligned bucket holding a timestamp column."""
    return F.floor(_micros(name) / F.lit(bucket_seconds * 1_000_000))


def completions(stage_results: DataFrame, bucket_seconds: int) -> DataFrame:
    """Completions per stage and bucket; bucket_start in epoch seconds."""
    start = (_bucket("completed_at", bucket_seconds) * bucket_seconds).alias("bucket_start")
    return stage_results.groupBy("stage", start).agg(F.count(F.lit(1)).alias("completions"))


def percentiles(frame: DataFrame, keys: list[str], value: str) -> DataFrame:
    """Count and exact p50/p95/p99 (linear interpolation) of `value` per `keys`."""
    values = F.percentile(F.col(value), list(QUANTILES))
    summary = frame.where(F.col(value).isNotNull()).groupBy(*keys).agg(
        F.count(F.lit(1)).alias("count"), values.alias("q"))
    return summary.select(*keys, "count", *(F.col("q")[i].alias(f"p{round(q * 100)}")
                                           for i, q in enumerate(QUANTILES)))


def _seconds_between(start: str, end: str) -> Column:
    return (_micros(end) - _micros(start)) / F.lit(1_000_000.0)


def end_to_end_latency(requests: DataFrame) -> DataFrame:
    """Seconds from produced_at to generated_at and to notified_at, as measures."""
    measures = F.explode(F.array(
        F.struct(F.lit("generated").alias("measure"),
                 _seconds_between("produced_at", "generated_at").alias("seconds")),
        F.struct(F.lit("notified").alias("measure"),
                 _seconds_between("produced_at", "notified_at").alias("seconds")),
    ))
    return percentiles(requests.select(measures.alias("m")).select("m.*"), ["measure"], "seconds")


def stage_latency(attempts: DataFrame) -> DataFrame:
    """AI call seconds of successful attempts, per stage."""
    ok = attempts.where(F.col("outcome") == "ok").withColumn(
        "seconds", _seconds_between("started_at", "ended_at"))
    return percentiles(ok, ["stage"], "seconds")


def member_load(attempts: DataFrame) -> DataFrame:
    """AI call attempts per group member: all of them and the successful ones."""
    return attempts.groupBy("member").agg(
        F.count(F.lit(1)).alias("attempts"),
        F.count(F.when(F.col("outcome") == "ok", 1)).alias("ok"))


def duplicate_calls(attempts: DataFrame) -> DataFrame:
    """AI calls that may have produced a result beyond the first per (request, stage), per stage:
    'ok' ones and 'started' ones that never ended (the member died during the call)."""
    per_request = (attempts.where(F.col("outcome").isin("ok", "started"))
                   .groupBy("request_id", "stage").agg(F.count(F.lit(1)).alias("calls")))
    return per_request.groupBy("stage").agg(F.sum(F.col("calls") - 1).alias("duplicates"))


def rebalance_windows(rebalances: DataFrame, run_end_us: int) -> DataFrame:
    """Merged rebalance windows per group: start_us, end_us (epoch microseconds), events."""
    events = rebalances.select("group_id", "event", _micros("at").alias("at_us"))
    opens = (events.where(F.col("event").isin(*OPENING_EVENTS))
             .groupBy("group_id", F.col("at_us").alias("start_us")).agg(F.count(F.lit(1)).alias("events")))
    assigns = events.where(F.col("event") == "assign").select(
        F.col("group_id").alias("g"), F.col("at_us").alias("assign_us"))
    later = (F.col("g") == F.col("group_id")) & (F.col("assign_us") >= F.col("start_us"))
    closed = (opens.join(assigns, later, "left")
              .groupBy("group_id", "start_us", "events")
              .agg(F.greatest(F.col("start_us"), F.coalesce(F.min("assign_us"), F.lit(run_end_us)))
                   .alias("end_us")))
    order = Window.partitionBy("group_id").orderBy("start_us", "end_us")
    reach = F.max("end_us").over(order.rowsBetween(Window.unboundedPreceding, -1))
    islands = (closed.withColumn("new", F.when(reach.isNull() | (F.col("start_us") > reach), 1).otherwise(0))
               .withColumn("island", F.sum("new").over(order.rowsBetween(Window.unboundedPreceding, 0))))
    return islands.groupBy("group_id", "island").agg(
        F.min("start_us").alias("start_us"), F.max("end_us").alias("end_us"),
        F.sum("events").alias("events")).drop("island")


def rebalance_cost(windows: DataFrame, stage_results: DataFrame, final_stage: str,
                   bucket_seconds: int) -> DataFrame:
    """Each window with cost_seconds: its touched buckets without a final-stage completion."""
    width = F.lit(bucket_seconds * 1_000_000)
    slots = windows.withColumn("slot", F.explode(F.sequence(F.floor(F.col("start_us") / width),
                                                            F.floor(F.col("end_us") / width))))
    busy = (stage_results.where(F.col("stage") == final_stage)
            .select(_bucket("completed_at", bucket_seconds).alias("slot")).distinct()
            .withColumn("busy", F.lit(True)))
    return (slots.join(busy, "slot", "left")
            .groupBy("group_id", "start_us", "end_us", "events")
            .agg((F.count(F.when(F.col("busy").isNull(), 1)) * bucket_seconds).alias("cost_seconds")))


def _max_micros(frame: DataFrame, name: str) -> int | None:
    return frame.agg(F.max(_micros(name))).first()[0]


def _rows(frame: DataFrame, *order: str) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.orderBy(*order).collect()]


def _quantiles(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("count", "p50", "p95", "p99")}


def analyse(frames: RunFrames, run_id: str, *, bucket_seconds: int = 1,
            final_stage: str = "generate") -> dict[str, Any]:
    """Every figure of the run as a JSON-ready document (see the module docstring)."""
    per_bucket = _rows(completions(frames.stage_results, bucket_seconds), "stage", "bucket_start")
    done = sum(b["completions"] for b in per_bucket if b["stage"] == final_stage)
    first_produced = frames.requests.agg(F.min(_micros("produced_at"))).first()[0]
    last_done = _max_micros(frames.stage_results.where(F.col("stage") == final_stage), "completed_at")
    span_s = None if first_produced is None or last_done is None else (last_done - first_produced) / 1e6

    instants = [t for t in (last_done, _max_micros(frames.rebalances, "at")) if t is not None]
    windows = [] if not instants else _rows(
        rebalance_cost(rebalance_windows(frames.rebalances, max(instants)), frames.stage_results,
                       final_stage, bucket_seconds), "group_id", "start_us")
    events = {r["event"]: r["count"] for r in _rows(frames.rebalances.groupBy("event").count(), "event")}
    duplicates = {r["stage"]: r["duplicates"] for r in _rows(duplicate_calls(frames.attempts), "stage")}
    return {
        "run_id": run_id,
        "bucket_seconds": bucket_seconds,
        "final_stage": final_stage,
        "requests": frames.requests.count(),
        "completed": done,
        "first_produced_at": job_io.utc_iso_us(first_produced),
        "last_completed_at": job_io.utc_iso_us(last_done),
        "completed_per_s": done / span_s if span_s else None,
        "completions": {stage: [{"bucket_start": job_io.utc_iso(b["bucket_start"]),
                                 "completions": b["completions"]}
                                for b in per_bucket if b["stage"] == stage]
                        for stage in sorted({b["stage"] for b in per_bucket})},
        "latency_s": {
            "end_to_end": {r["measure"]: _quantiles(r) for r in _rows(end_to_end_latency(frames.requests),
                                                                      "measure")},
            "stages": {r["stage"]: _quantiles(r) for r in _rows(stage_latency(frames.attempts), "stage")},
        },
        "members": {r["member"]: {"attempts": r["attempts"], "ok": r["ok"]}
                    for r in _rows(member_load(frames.attempts), "member")},
        "duplicates": {"total": sum(duplicates.values()), "by_stage": duplicates},
        "rebalances": {
            "events": events,
            "windows": [{"group_id": w["group_id"], "start": job_io.utc_iso_us(w["start_us"]),
                         "end": job_io.utc_iso_us(w["end_us"]),
                         "seconds": (w["end_us"] - w["start_us"]) / 1e6,
                         "events": w["events"], "cost_seconds": w["cost_seconds"]} for w in windows],
            "cost_seconds": sum(w["cost_seconds"] for w in windows),
        },
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    job_io.add_common_args(parser, jdbc=True)
    parser.add_argument("--bucket-seconds", type=int, default=1, help="time bucket length (default 1)")
    parser.add_argument("--final-stage", default="generate", help="the stage that completes a request")
    args = parser.parse_args(argv)
    if not args.run_id:
        parser.error("--run-id is required: it selects the run to analyse")
    if not args.database_url and not args.jdbc_url:
        parser.error("no database: pass --database-url or --jdbc-url (or set DATABASE_URL)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    jdbc = job_io.jdbc_from(args.database_url, args.jdbc_url)
    spark = build("pipeline-analysis", args.master)
    frames = load_run(spark, jdbc, args.run_id).cache()
    figures = analyse(frames, args.run_id, bucket_seconds=args.bucket_seconds, final_stage=args.final_stage)
    job_io.write_json(args.output_json, figures)
    if args.database_url:
        job_io.upsert_figures(args.database_url, "analysis_pipeline", args.run_id, figures)
    print(f"{args.run_id}: {figures['completed']} completed of {figures['requests']}, "
          f"{figures['duplicates']['total']} duplicate AI calls, "
          f"{len(figures['rebalances']['windows'])} rebalance windows costing "
          f"{figures['rebalances']['cost_seconds']} s")
    return figures


if __name__ == "__main__":
    main()
