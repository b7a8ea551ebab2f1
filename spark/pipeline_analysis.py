"""Figures of one pipeline run from its records in PostgreSQL (read through JDBC).

The standard figures are defined in `measure/figures.py` (its docstring says what each means):
this job gets their aggregates with DataFrames, and the driver turns the small results into
figures with that module, as `bench/figures.py` does from SQL. Per run it computes:

- completions per stage and epoch-aligned bucket of `--bucket-seconds` (`stage_results` rows of
  any outcome: the stage finished with the request);
- status counts, span (first produce -> last terminal state: the latest `finished_at` of a
  completed or rejected request, or dead letter of a dead-lettered one), throughput and steady
  throughput (from the final stage's completion times, collected to the driver);
- latency percentiles p50/p95/p99, exact, with linear interpolation between the two closest
  ranks (Spark `percentile` = PostgreSQL `percentile_cont` = `measure.figures.percentile`):
  completed requests from `produced_at` to `finished_at` ('finished') and to `notified_at`
  ('notified': the terminal route's events were acknowledged); per stage of
  the 'ok' attempts (`ended_at - started_at`), with their mean: the stage's service time, and
  their count (`ok_calls`);
- the steady band (`measure.figures.steady_band`, from the final stage's completion times) and
  per AI stage the work of its 'ok' calls inside it (`band_work`: call-seconds inside the band
  and calls ended inside it, as `measure.capacity.band_work` counts them): what the capacity's
  utilization is counted on;
- member load: AI call attempts per group member (all outcomes, and 'ok' ones);
- duplicate AI calls per stage (outcomes in `measure.figures.CALL_OUTCOMES`);
- rebalance windows: each 'revoke' or 'lost' event opens a window in its consumer group that
  closes at the group's first 'assign' event at or after it (or at the run's last recorded
  instant, completion or rebalance event, when none follows); overlapping windows of one group
  merge. A window's cost is the idle time it caused at bucket resolution: the number of
  buckets the window touches (from the one holding its start to the one holding its end) in
  which no final-stage completion happened, times `--bucket-seconds`.

`--run-id` takes one run or several, comma-separated (the trials of a tuning run): one Spark
session analyses them side by side and stores one document per run. Runs as
`python -m spark.pipeline_analysis` or `spark-submit spark/pipeline_analysis.py` (see
spark/partition_load.py for how the script finds the project).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: import the project from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from measure import figures
from spark import job_io
from spark.job_io import collect_sorted
from spark.session import build

OPENING_EVENTS = ("revoke", "lost")


@dataclass(frozen=True)
class RunFrames:
    """One run's rows, timestamps kept as timestamps."""

    requests: DataFrame
    stage_results: DataFrame
    attempts: DataFrame
    rebalances: DataFrame
    dead_letters: DataFrame

    def cache(self) -> RunFrames:
        return RunFrames(*(frame.cache() for frame in (self.requests, self.stage_results, self.attempts,
                                                       self.rebalances, self.dead_letters)))


def load_run(spark: SparkSession, jdbc: job_io.Jdbc, run_id: str) -> RunFrames:
    """The run's rows, filtered by run_id inside PostgreSQL (the `query` option). Dead letters
    are joined by (pipeline, request): the fleet that wrote one may record it under its
    deployment's run id."""
    run = job_io.sql_literal(run_id)

    def query(columns: str, table: str) -> DataFrame:
        return job_io.read_query(spark, jdbc, f"SELECT {columns} FROM {table} WHERE run_id = {run}")

    return RunFrames(
        query("pipeline, request_id, status, produced_at, finished_at, notified_at", "requests"),
        query("request_id, stage, outcome, member, completed_at", "stage_results"),
        query("request_id, stage, member, outcome, started_at, ended_at", "ai_attempts"),
        query("group_id, member, event, at", "rebalance_events"),
        job_io.read_query(spark, jdbc, "SELECT d.pipeline, d.request_id, d.at FROM dead_letters d "
                                       "JOIN requests r ON r.pipeline = d.pipeline AND "
                                       f"r.request_id = d.request_id WHERE r.run_id = {run}"),
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
    """Count, mean and exact p50/p95/p99 (linear interpolation) of `value` per `keys`."""
    values = F.percentile(F.col(value), list(figures.QUANTILES))
    summary = frame.where(F.col(value).isNotNull()).groupBy(*keys).agg(
        F.count(F.lit(1)).alias("count"), F.avg(value).alias("mean"), values.alias("q"))
    return summary.select(*keys, "count", "mean", *(F.col("q")[i].alias(f"p{round(q * 100)}")
                                                   for i, q in enumerate(figures.QUANTILES)))


def _seconds_between(start: str, end: str) -> Column:
    return (_micros(end) - _micros(start)) / F.lit(1_000_000.0)


def end_to_end_latency(requests: DataFrame) -> DataFrame:
    """Seconds of completed requests from produced_at to finished_at and to notified_at."""
    measures = F.explode(F.array(
        F.struct(F.lit("finished").alias("measure"),
                 _seconds_between("produced_at", "finished_at").alias("seconds")),
        F.struct(F.lit("notified").alias("measure"),
                 _seconds_between("produced_at", "notified_at").alias("seconds")),
    ))
    completed = requests.where(F.col("status") == "completed")
    return percentiles(completed.select(measures.alias("m")).select("m.*"), ["measure"], "seconds")


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


def repeated_calls(attempts: DataFrame) -> DataFrame:
    """(request, stage) pairs with more than one call that may have produced a result or been
    charged (outcomes in CALL_OUTCOMES), with their number of calls: few rows, for the driver."""
    per_request = (attempts.where(F.col("outcome").isin(*figures.CALL_OUTCOMES))
                   .groupBy("request_id", "stage").agg(F.count(F.lit(1)).alias("calls")))
    return per_request.where(F.col("calls") > 1)


def band_work(attempts: DataFrame, band: tuple[float, float]) -> DataFrame:
    """Per stage, the 'ok' calls' seconds inside the band (epoch s) and the calls ended inside it
    (measure.capacity.band_work)."""
    start, end = (F.lit(round(b * 1_000_000)) for b in band)
    started, ended = _micros("started_at"), _micros("ended_at")
    inside = F.greatest(F.lit(0), F.least(ended, end) - F.greatest(started, start)) / F.lit(1_000_000.0)
    return (attempts.where(F.col("outcome") == "ok").groupBy("stage")
            .agg(F.sum(inside).alias("busy_s"),
                 F.count(F.when((ended >= start) & (ended <= end), 1)).alias("calls")))


def last_terminal_us(frames: RunFrames) -> int | None:
    """When the last request reached its terminal state (epoch microseconds): a completed or
    rejected one's finished_at, a dead-lettered one's latest dead letter."""
    requests = frames.requests
    dead = (frames.dead_letters
            .join(requests.where(F.col("status") == "dead_lettered"), ["pipeline", "request_id"])
            .select(_micros("at").alias("t")))
    finished = (requests.where(F.col("status").isin("completed", "rejected"))
                .select(_micros("finished_at").alias("t")))
    return _aggregate(finished.unionByName(dead), F.max("t"))


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


def _aggregate(frame: DataFrame, column: Column) -> Any:
    """One aggregate over the whole frame: its one row is always there (None over no rows)."""
    row = frame.agg(column).first()
    assert row is not None
    return row[0]


def _max_micros(frame: DataFrame, name: str) -> int | None:
    return _aggregate(frame, F.max(_micros(name)))


def _quantiles(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("count", "mean", "p50", "p95", "p99")}


def analyse(frames: RunFrames, run_id: str, *, bucket_seconds: int = 1,
            final_stage: str = "generate") -> dict[str, Any]:
    """Every figure of the run as a JSON-ready document (see the module docstring)."""
    per_bucket = collect_sorted(completions(frames.stage_results, bucket_seconds), "stage", "bucket_start")
    final = frames.stage_results.where(F.col("stage") == final_stage)
    times = sorted(r[0] / 1e6 for r in final.select(_micros("completed_at")).collect())
    status = {r["status"]: r["count"]
              for r in collect_sorted(frames.requests.groupBy("status").count(), "status")}
    first_produced = _aggregate(frames.requests, F.min(_micros("produced_at")))
    last_terminal = last_terminal_us(frames)
    span = figures.span_s(None if first_produced is None else first_produced / 1e6,
                          None if last_terminal is None else last_terminal / 1e6)

    instants = [t for t in (_max_micros(final, "completed_at"), _max_micros(frames.rebalances, "at"))
                if t is not None]
    windows = [] if not instants else collect_sorted(
        rebalance_cost(rebalance_windows(frames.rebalances, max(instants)), frames.stage_results,
                       final_stage, bucket_seconds), "group_id", "start_us")
    events = {r["event"]: r["count"]
              for r in collect_sorted(frames.rebalances.groupBy("event").count(), "event")}
    repeated: dict[str, list[int]] = {}
    for r in collect_sorted(repeated_calls(frames.attempts), "stage"):
        repeated.setdefault(r["stage"], []).append(r["calls"])
    duplicates = {stage: figures.beyond_first(calls) for stage, calls in repeated.items()}
    stages = {r["stage"]: _quantiles(r) for r in collect_sorted(stage_latency(frames.attempts), "stage")}
    band = figures.steady_band(times)
    work = {} if band is None else {r["stage"]: {"busy_s": r["busy_s"], "calls": r["calls"]}
                                    for r in collect_sorted(band_work(frames.attempts, band), "stage")}
    return {
        "run_id": run_id,
        "bucket_seconds": bucket_seconds,
        "final_stage": final_stage,
        "requests": frames.requests.count(),
        "status": status,
        "completed": status.get("completed", 0),
        "first_produced_at": job_io.utc_iso_us(first_produced),
        "last_terminal_at": job_io.utc_iso_us(last_terminal),
        "span_s": span,
        "throughput_rps": figures.throughput_rps(status.get("completed", 0), span),
        "steady_throughput_rps": figures.steady_rate(times),
        "service_s": {stage: q["mean"] for stage, q in stages.items()},
        "ok_calls": {stage: q["count"] for stage, q in stages.items()},
        "steady_band": list(band) if band else None,
        "band_work": work,
        "completions": {stage: [{"bucket_start": job_io.utc_iso(b["bucket_start"]),
                                 "completions": b["completions"]}
                                for b in per_bucket if b["stage"] == stage]
                        for stage in sorted({b["stage"] for b in per_bucket})},
        "latency_s": {
            "end_to_end": {r["measure"]: _quantiles(r)
                           for r in collect_sorted(end_to_end_latency(frames.requests), "measure")},
            "stages": stages,
        },
        "members": {r["member"]: {"attempts": r["attempts"], "ok": r["ok"]}
                    for r in collect_sorted(member_load(frames.attempts), "member")},
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
        parser.error("--run-id is required: it selects the run(s) to analyse")
    if not args.database_url and not args.jdbc_url:
        parser.error("no database: pass --database-url or --jdbc-url (or set DATABASE_URL)")
    return args


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Analyse each run of --run-id; return the documents by run id."""
    args = parse_args(argv)
    jdbc = job_io.jdbc_from(args.database_url, args.jdbc_url)
    spark = build("pipeline-analysis", args.master)
    run_ids = [r for r in args.run_id.split(",") if r]

    def one(run_id: str) -> dict[str, Any]:
        frames = load_run(spark, jdbc, run_id).cache()
        return analyse(frames, run_id, bucket_seconds=args.bucket_seconds, final_stage=args.final_stage)

    # The runs' jobs go to Spark side by side: each is dozens of small jobs whose time is mostly
    # scheduling, which the others' jobs fill (three trials: 8.3 s instead of 16.4 s, warm).
    with ThreadPoolExecutor(max_workers=len(run_ids)) as pool:
        analysed = list(pool.map(one, run_ids))
    documents = {}
    for run_id, doc in zip(run_ids, analysed, strict=True):
        if args.database_url:
            job_io.upsert_figures(args.database_url, "analysis_pipeline", run_id, doc)
        print(f"{run_id}: {doc['completed']} completed of {doc['requests']}, "
              f"{doc['steady_throughput_rps']:.2f} rps steady, {doc['duplicates']['total']} duplicate AI "
              f"calls, {len(doc['rebalances']['windows'])} rebalance windows costing "
              f"{doc['rebalances']['cost_seconds']} s")
        documents[run_id] = doc
    job_io.write_json(args.output_json, documents if len(documents) > 1 else next(iter(documents.values())))
    return documents


if __name__ == "__main__":
    main()
