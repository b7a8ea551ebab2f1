"""Figures of one pipeline run from its records in PostgreSQL (read through JDBC).

The standard figures are defined in `measure/figures.py` (its docstring says what each means):
this job gets their aggregates with DataFrames, and the driver turns the small results into
figures with that module, as `consumers/runs/run_figures.py` does from SQL. Per run it computes:

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
  per AI stage the work of its 'ok' calls against it (`band_work`: call-seconds inside the band,
  calls started inside it and before it, the first one's start, as `measure.capacity.band_work`
  counts them): what the capacity's utilization is counted on;
- member load: AI call attempts per group member (all outcomes, and 'ok' ones);
- duplicate AI calls per stage (billed tries, `measure.cost.BILLED_SQL`);
- rebalance windows: each 'revoke' or 'lost' event opens a window in its consumer group that
  closes at the group's first 'assign' event at or after it (or at the run's last recorded
  instant, completion or rebalance event, when none follows); overlapping windows of one group
  merge. A window's cost is the idle time it caused at bucket resolution: the number of
  buckets the window touches (from the one holding its start to the one holding its end) in
  which no final-stage completion happened, times `--bucket-seconds`.

`--run-id` takes one run or several, comma-separated (the trials of a tuning run): their rows
are read together and every figure is one query grouped by run, so a tuning run's three trials
cost the Spark jobs of one; one document per run is stored. Runs as
`python -m spark.pipeline_analysis` or `spark-submit spark/pipeline_analysis.py` (see
spark/partition_load.py for how the script finds the project).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: import the project from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from measure import cost, figures
from spark import job_io
from spark.job_io import collect_sorted
from spark.session import job_session

OPENING_EVENTS = ("revoke", "lost")
# A run's rows are thousands: every shuffle of this job fits one task, and more tasks only cost
# their scheduling.
SHUFFLE_PARTITIONS = 1
RUN = "run_id"  # every frame and every aggregate carries the run it belongs to


@dataclass(frozen=True)
class RunFrames:
    """The runs' rows, each with its run_id, timestamps kept as timestamps."""

    requests: DataFrame
    stage_results: DataFrame
    attempts: DataFrame
    rebalances: DataFrame
    dead_letters: DataFrame

    def frames(self) -> tuple[DataFrame, ...]:
        return self.requests, self.stage_results, self.attempts, self.rebalances, self.dead_letters

    def cache(self) -> RunFrames:
        return RunFrames(*(frame.cache() for frame in self.frames()))


def load_runs(spark: SparkSession, jdbc: job_io.Jdbc, run_ids: Sequence[str]) -> RunFrames:
    """The runs' rows, filtered by run_id inside PostgreSQL (the `query` option): one read per
    table for all the runs. Dead letters are joined by (pipeline, request) and take the request's
    run: the fleet that wrote one may record it under its deployment's run id."""
    runs = ", ".join(job_io.sql_literal(r) for r in run_ids)

    def query(columns: str, table: str) -> DataFrame:
        return job_io.read_query(spark, jdbc,
                                 f"SELECT run_id, {columns} FROM {table} WHERE run_id IN ({runs})")

    return RunFrames(
        query("pipeline, request_id, status, produced_at, finished_at, notified_at", "requests"),
        query("request_id, stage, outcome, member, completed_at", "stage_results"),
        query("request_id, stage, member, outcome, http_status, started_at, ended_at", "ai_attempts"),
        query("group_id, member, event, at", "rebalance_events"),
        job_io.read_query(spark, jdbc, "SELECT r.run_id, d.pipeline, d.request_id, d.at FROM dead_letters d "
                                       "JOIN requests r ON r.pipeline = d.pipeline AND "
                                       f"r.request_id = d.request_id WHERE r.run_id IN ({runs})"),
    )


def _micros(name: str) -> Column:
    return F.unix_micros(F.col(name))


def _bucket(name: str, bucket_seconds: int) -> Column:
    """Index of the epoch-aligned bucket holding a timestamp column."""
    return F.floor(_micros(name) / F.lit(bucket_seconds * 1_000_000))


def _per_run(values: Mapping[str, int]) -> Column:
    """Each row's run's value (epoch microseconds) from a driver-side mapping; null for a run
    without one."""
    pairs = chain.from_iterable((F.lit(run), F.lit(value).cast("long")) for run, value in values.items())
    return F.create_map(*pairs)[F.col(RUN)]


def completions(stage_results: DataFrame, bucket_seconds: int) -> DataFrame:
    """Completions per run, stage and bucket; bucket_start in epoch seconds."""
    start = (_bucket("completed_at", bucket_seconds) * bucket_seconds).alias("bucket_start")
    return stage_results.groupBy(RUN, "stage", start).agg(F.count(F.lit(1)).alias("completions"))


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
    """Seconds of completed requests from produced_at to finished_at and to notified_at, per run."""
    measures = F.explode(F.array(
        F.struct(F.lit("finished").alias("measure"),
                 _seconds_between("produced_at", "finished_at").alias("seconds")),
        F.struct(F.lit("notified").alias("measure"),
                 _seconds_between("produced_at", "notified_at").alias("seconds")),
    ))
    completed = requests.where(F.col("status") == "completed")
    return percentiles(completed.select(RUN, measures.alias("m")).select(RUN, "m.*"), [RUN, "measure"],
                       "seconds")


def stage_latency(attempts: DataFrame) -> DataFrame:
    """AI call seconds of successful attempts, per run and stage."""
    ok = attempts.where(F.col("outcome") == "ok").withColumn(
        "seconds", _seconds_between("started_at", "ended_at"))
    return percentiles(ok, [RUN, "stage"], "seconds")


def member_load(attempts: DataFrame) -> DataFrame:
    """AI call attempts per run and group member: all of them and the successful ones."""
    return attempts.groupBy(RUN, "member").agg(
        F.count(F.lit(1)).alias("attempts"),
        F.count(F.when(F.col("outcome") == "ok", 1)).alias("ok"))


def repeated_calls(attempts: DataFrame) -> DataFrame:
    """(run, request, stage) with more than one call the provider may have billed
    (measure.cost.BILLED_SQL), with their number of calls: few rows, for the driver."""
    per_request = (attempts.where(F.expr(cost.BILLED_SQL))
                   .groupBy(RUN, "request_id", "stage").agg(F.count(F.lit(1)).alias("calls")))
    return per_request.where(F.col("calls") > 1)


def band_work(attempts: DataFrame, bands: Mapping[str, tuple[float, float]]) -> DataFrame:
    """Per run with a band (epoch s) and stage, the 'ok' calls' seconds inside the band, the
    calls started inside it and before it, and the first one's start (epoch s):
    measure.capacity.BandWork."""
    start = _per_run({run: round(band[0] * 1_000_000) for run, band in bands.items()})
    end = _per_run({run: round(band[1] * 1_000_000) for run, band in bands.items()})
    started, ended = _micros("started_at"), _micros("ended_at")
    inside = F.greatest(F.lit(0), F.least(ended, end) - F.greatest(started, start)) / F.lit(1_000_000.0)
    return (attempts.where((F.col("outcome") == "ok") & start.isNotNull()).groupBy(RUN, "stage")
            .agg(F.sum(inside).alias("busy_s"),
                 F.count(F.when((started >= start) & (started <= end), 1)).alias("started"),
                 F.count(F.when(started < start, 1)).alias("before"),
                 (F.min(started) / F.lit(1_000_000.0)).alias("first_s")))


def request_states(frames: RunFrames) -> DataFrame:
    """Per run and status: requests, the first one's produced_at and when the last one reached
    its terminal state (`first_us`, `terminal_us`, epoch microseconds): a completed or rejected
    one's finished_at, a dead-lettered one's latest dead letter; null for other statuses."""
    dead = (frames.dead_letters.groupBy(RUN, "pipeline", "request_id")
            .agg(F.max(_micros("at")).alias("dead_us")))
    status = F.col("status")
    terminal = (F.when(status.isin("completed", "rejected"), _micros("finished_at"))
                .when(status == "dead_lettered", F.col("dead_us")))
    return (frames.requests.join(dead, [RUN, "pipeline", "request_id"], "left")
            .groupBy(RUN, "status").agg(F.count(F.lit(1)).alias("count"),
                                        F.min(_micros("produced_at")).alias("first_us"),
                                        F.max(terminal).alias("terminal_us")))


def rebalance_events(rebalances: DataFrame) -> DataFrame:
    """Per run and event: how many, and the last one's instant (`last_us`, epoch microseconds)."""
    return rebalances.groupBy(RUN, "event").agg(F.count(F.lit(1)).alias("count"),
                                                F.max(_micros("at")).alias("last_us"))


def rebalance_windows(rebalances: DataFrame, run_end_us: Mapping[str, int]) -> DataFrame:
    """Merged rebalance windows per run and group: start_us, end_us (epoch microseconds), events.
    A window nothing closes ends at its run's end (`run_end_us`)."""
    events = rebalances.select(RUN, "group_id", "event", _micros("at").alias("at_us"))
    opens = (events.where(F.col("event").isin(*OPENING_EVENTS))
             .groupBy(RUN, "group_id", F.col("at_us").alias("start_us"))
             .agg(F.count(F.lit(1)).alias("events")))
    assigns = events.where(F.col("event") == "assign").select(
        F.col(RUN).alias("r"), F.col("group_id").alias("g"), F.col("at_us").alias("assign_us"))
    later = ((F.col("r") == F.col(RUN)) & (F.col("g") == F.col("group_id"))
             & (F.col("assign_us") >= F.col("start_us")))
    closed = (opens.join(assigns, later, "left")
              .groupBy(RUN, "group_id", "start_us", "events")
              .agg(F.greatest(F.col("start_us"), F.coalesce(F.min("assign_us"), _per_run(run_end_us)))
                   .alias("end_us")))
    order = Window.partitionBy(RUN, "group_id").orderBy("start_us", "end_us")
    reach = F.max("end_us").over(order.rowsBetween(Window.unboundedPreceding, -1))
    islands = (closed.withColumn("new", F.when(reach.isNull() | (F.col("start_us") > reach), 1).otherwise(0))
               .withColumn("island", F.sum("new").over(order.rowsBetween(Window.unboundedPreceding, 0))))
    return islands.groupBy(RUN, "group_id", "island").agg(
        F.min("start_us").alias("start_us"), F.max("end_us").alias("end_us"),
        F.sum("events").alias("events")).drop("island")


def rebalance_cost(windows: DataFrame, stage_results: DataFrame, final_stage: str,
                   bucket_seconds: int) -> DataFrame:
    """Each window with cost_seconds: its touched buckets without a final-stage completion of its run."""
    width = F.lit(bucket_seconds * 1_000_000)
    slots = windows.withColumn("slot", F.explode(F.sequence(F.floor(F.col("start_us") / width),
                                                            F.floor(F.col("end_us") / width))))
    busy = (stage_results.where(F.col("stage") == final_stage)
            .select(RUN, _bucket("completed_at", bucket_seconds).alias("slot")).distinct()
            .withColumn("busy", F.lit(True)))
    return (slots.join(busy, [RUN, "slot"], "left")
            .groupBy(RUN, "group_id", "start_us", "end_us", "events")
            .agg((F.count(F.when(F.col("busy").isNull(), 1)) * bucket_seconds).alias("cost_seconds")))


def _quantiles(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("count", "mean", "p50", "p95", "p99")}


def _by_run(rows: list[dict[str, Any]]) -> defaultdict[str, list[dict[str, Any]]]:
    """Collected rows by their run, in their order."""
    runs: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        runs[row[RUN]].append(row)
    return runs


def _extreme(values: Sequence[int | None], pick: Any) -> int | None:
    present = [v for v in values if v is not None]
    return pick(present) if present else None


def analyse(frames: RunFrames, run_ids: Sequence[str], *, bucket_seconds: int = 1,
            final_stage: str = "generate") -> dict[str, dict[str, Any]]:
    """Every figure of each run as a JSON-ready document, by run id (see the module docstring).

    Each figure is one query over all the runs, grouped by run: a Spark job costs about the same
    for three runs' few thousand rows as for one run's, and most of this job's time is its jobs'
    scheduling."""
    completed_us = _by_run([r.asDict() for r in frames.stage_results.where(F.col("stage") == final_stage)
                            .select(RUN, _micros("completed_at").alias("us")).collect()])
    times = {run: sorted(r["us"] / 1e6 for r in completed_us[run]) for run in run_ids}
    states = _by_run(collect_sorted(request_states(frames), RUN, "status"))
    events = _by_run(collect_sorted(rebalance_events(frames.rebalances), RUN, "event"))
    ends = {run: end for run in run_ids
            if (end := _extreme([r["us"] for r in completed_us[run]] + [r["last_us"] for r in events[run]],
                                max)) is not None}
    windows = _by_run([] if not ends else collect_sorted(
        rebalance_cost(rebalance_windows(frames.rebalances, ends), frames.stage_results, final_stage,
                       bucket_seconds), RUN, "group_id", "start_us"))
    bands = {run: band for run in run_ids if (band := figures.steady_band(times[run])) is not None}
    work = _by_run([] if not bands else collect_sorted(band_work(frames.attempts, bands), RUN, "stage"))
    per_bucket = _by_run(collect_sorted(completions(frames.stage_results, bucket_seconds), RUN, "stage",
                                        "bucket_start"))
    repeated = _by_run(collect_sorted(repeated_calls(frames.attempts), RUN, "stage"))
    stages = _by_run(collect_sorted(stage_latency(frames.attempts), RUN, "stage"))
    end_to_end = _by_run(collect_sorted(end_to_end_latency(frames.requests), RUN, "measure"))
    members = _by_run(collect_sorted(member_load(frames.attempts), RUN, "member"))
    return {run: document(
        run, bucket_seconds, final_stage, times[run], states[run], events[run], windows[run], work[run],
        per_bucket[run], repeated[run], stages[run], end_to_end[run], members[run]) for run in run_ids}


def document(run_id: str, bucket_seconds: int, final_stage: str, times: list[float],
             states: list[dict[str, Any]], events: list[dict[str, Any]], windows: list[dict[str, Any]],
             work: list[dict[str, Any]], per_bucket: list[dict[str, Any]], repeated: list[dict[str, Any]],
             stage_rows: list[dict[str, Any]], end_to_end: list[dict[str, Any]],
             members: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's figures from its rows of each query (analyse)."""
    status = {r["status"]: r["count"] for r in states}
    first_produced = _extreme([r["first_us"] for r in states], min)
    last_terminal = _extreme([r["terminal_us"] for r in states], max)
    span = figures.span_s(None if first_produced is None else first_produced / 1e6,
                          None if last_terminal is None else last_terminal / 1e6)
    calls: dict[str, list[int]] = {}
    for r in repeated:
        calls.setdefault(r["stage"], []).append(r["calls"])
    duplicates = {stage: figures.beyond_first(c) for stage, c in calls.items()}
    stages = {r["stage"]: _quantiles(r) for r in stage_rows}
    band = figures.steady_band(times)
    return {
        "run_id": run_id,
        "bucket_seconds": bucket_seconds,
        "final_stage": final_stage,
        "requests": sum(status.values()),
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
        "band_work": {r["stage"]: {key: r[key] for key in ("busy_s", "started", "before", "first_s")}
                      for r in work},
        "completions": {stage: [{"bucket_start": job_io.utc_iso(b["bucket_start"]),
                                 "completions": b["completions"]}
                                for b in per_bucket if b["stage"] == stage]
                        for stage in sorted({b["stage"] for b in per_bucket})},
        "latency_s": {
            "end_to_end": {r["measure"]: _quantiles(r) for r in end_to_end},
            "stages": stages,
        },
        "members": {r["member"]: {"attempts": r["attempts"], "ok": r["ok"]} for r in members},
        "duplicates": {"total": sum(duplicates.values()), "by_stage": duplicates},
        "rebalances": {
            "events": {r["event"]: r["count"] for r in events},
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
    run_ids = list(dict.fromkeys(r for r in args.run_id.split(",") if r))
    with job_session("pipeline-analysis", args.master, remote_url=args.remote, own_settings=True) as spark:
        spark.conf.set("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        frames = load_runs(spark, jdbc, run_ids).cache()
        try:
            documents = analyse(frames, run_ids, bucket_seconds=args.bucket_seconds,
                                final_stage=args.final_stage)
        finally:
            # On a Connect server what a session cached outlives it, and unpersist() missed three
            # of the five frames there (Spark 4.0.0); nothing else the analyses run caches.
            spark.catalog.clearCache()
    for run_id, doc in documents.items():
        if args.database_url:
            job_io.upsert_figures(args.database_url, "analysis_pipeline", run_id, doc)
        print(f"{run_id}: {doc['completed']} completed of {doc['requests']}, "
              f"{doc['steady_throughput_rps']:.2f} rps steady, {doc['duplicates']['total']} duplicate AI "
              f"calls, {len(doc['rebalances']['windows'])} rebalance windows costing "
              f"{doc['rebalances']['cost_seconds']} s")
    job_io.write_json(args.output_json, documents if len(documents) > 1 else next(iter(documents.values())))
    return documents


if __name__ == "__main__":
    main()
