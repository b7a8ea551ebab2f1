"""A run's standard figures from its records in PostgreSQL: the SQL side of measure.figures
(which defines each figure; spark/pipeline_analysis.py is the Spark side, and a test checks that
both agree on the same run). The runtime's own reading of what it recorded, so the benchmark,
the capacity search and anything else that drives the pipeline compute figures alike. A run's
cost figures (measure.cost) come from its attempt rows, fetched by ATTEMPTS_SQL here and by the
gate through its hook.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import replace
from typing import Any

import psycopg2

from consumers.config.pipeline_spec import HttpWork, PipelineSpec
from consumers.runs.pipeline_run import Pipeline
from measure import capacity, cost, figures


def rows(database_url: str, sql: str, params: tuple | dict = ()) -> list[tuple]:
    """The rows of one query."""
    with closing(psycopg2.connect(database_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


# First produce and last terminal state (measure.figures.span_s); a dead letter is joined by
# request, since the fleet that wrote it may record it under its deployment's run id.
SPAN_SQL = """
SELECT extract(epoch FROM min(r.produced_at)),
       extract(epoch FROM greatest(
         max(r.finished_at) FILTER (WHERE r.status IN ('completed', 'rejected')),
         (SELECT max(d.at) FROM dead_letters d
          JOIN requests dr ON (dr.pipeline, dr.request_id) = (d.pipeline, d.request_id)
          WHERE dr.run_id = %(run)s AND dr.status = 'dead_lettered')))
FROM requests r WHERE r.run_id = %(run)s
"""

COMPLETIONS_SQL = """
SELECT extract(epoch FROM completed_at) FROM stage_results
WHERE run_id = %(run)s AND stage = %(final_stage)s ORDER BY completed_at
"""

OK_CALLS_SQL = """
SELECT stage, kafka_partition, extract(epoch FROM started_at), extract(epoch FROM ended_at) FROM ai_attempts
WHERE run_id = %(run)s AND outcome = 'ok'
"""

REPEATED_CALLS_SQL = f"""
SELECT count(*) FROM ai_attempts WHERE run_id = %(run)s AND {cost.BILLED_SQL}
GROUP BY request_id, stage HAVING count(*) > 1
"""

# Every try of a run in the order written, as measure.cost.Attempt reads it, with whether its
# (request, stage) has a recorded result.
ATTEMPTS_SQL = """
SELECT a.request_id, a.stage, a.outcome, a.http_status, a.tokens_input, a.tokens_output, a.reported_cost,
       EXISTS (SELECT FROM stage_results s WHERE s.pipeline = a.pipeline AND s.request_id = a.request_id
               AND s.stage = a.stage), a.tier
FROM ai_attempts a WHERE a.run_id = %(run)s ORDER BY a.id
"""

# Completed requests whose end-to-end latency (produced -> notified, as measure.figures has it)
# is at most %(objective)s seconds: those that met a latency objective.
WITHIN_OBJECTIVE_SQL = """
SELECT count(*) FROM requests WHERE run_id = %(run)s AND status = 'completed'
  AND extract(epoch FROM notified_at - produced_at) <= %(objective)s
"""

LATENCY_SQL = """
SELECT extract(epoch FROM r.notified_at - r.produced_at), ai.per_stage
FROM requests r LEFT JOIN (
  SELECT request_id, json_object_agg(stage, ai_s) AS per_stage FROM (
    SELECT request_id, stage, sum(extract(epoch FROM ended_at - started_at)) AS ai_s FROM ai_attempts
    WHERE run_id = %(run)s AND outcome = 'ok' GROUP BY request_id, stage) calls
  GROUP BY request_id) ai USING (request_id)
WHERE r.run_id = %(run)s AND r.status = 'completed' AND r.produced_at IS NOT NULL
  AND r.notified_at IS NOT NULL
"""


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def completion_times(database_url: str, run_id: str, final_stage: str) -> list[float]:
    """When the pipeline's completing stage recorded each result."""
    found = rows(database_url, COMPLETIONS_SQL, {"run": run_id, "final_stage": final_stage})
    return [float(r[0]) for r in found]


def limits_of(spec: PipelineSpec, concurrency: int | None = None, time_scale: float = 1.0,
              tokens_per_call: dict[str, float] | None = None) -> capacity.Limits:
    """The capacity's inputs a spec declares: each endpoint's concurrency (`concurrency` when the
    run set one limit for every endpoint, as the stand-in is configured) and per-minute budgets,
    and the endpoint each AI stage calls."""
    return capacity.Limits(
        {name: capacity.EndpointLimits(concurrency or e.concurrency, e.requests_per_minute,
                                       e.tokens_per_minute, e.tokens) for name, e in spec.endpoints.items()},
        {name: s.work.endpoint for name, s in spec.stages.items() if isinstance(s.work, HttpWork)},
        time_scale, tokens_per_call or {})


def objective_at(spec: PipelineSpec, time_scale: float) -> tuple[float, float] | None:
    """The spec's latency objective (seconds, share) at a run's time scale, which shortens
    every latency alike; None when it declares none."""
    if spec.objective is None:
        return None
    return spec.objective.latency_s * time_scale, spec.objective.share


def prices_of(spec: PipelineSpec) -> dict[str, cost.Prices | None]:
    """Each AI stage's declared prices (its endpoint's `price`; None: none declared)."""
    prices = {}
    for stage in spec.ai_stages:
        endpoint = spec.endpoint_of(stage)
        price = endpoint.price if endpoint else None
        prices[stage] = price.prices if price else None
    return prices


def tier_prices_of(spec: PipelineSpec) -> dict[tuple[str, str], cost.Prices]:
    """Each AI stage's prices at the other tiers its endpoint sells, by (stage, tier)."""
    prices = {}
    for stage in spec.ai_stages:
        endpoint = spec.endpoint_of(stage)
        for tier in ("batch", "flex"):
            sold = endpoint.tiers.of(tier) if endpoint else None
            if sold is not None and sold.price is not None:
                prices[(stage, tier)] = sold.price.prices
    return prices


def attempt_costs(found: Iterable[Sequence[Any]], completed: int, spec: PipelineSpec) -> dict[str, Any]:
    """measure.cost.run_costs of a run from its ATTEMPTS_SQL rows, however they were fetched."""
    return cost.run_costs([cost.Attempt(*row) for row in found], completed, prices_of(spec),
                          tier_prices_of(spec))


def cost_figures(database_url: str, run_id: str, completed: int, spec: PipelineSpec) -> dict[str, Any]:
    """A run's cost figures from its attempt rows (measure.cost)."""
    return attempt_costs(rows(database_url, ATTEMPTS_SQL, {"run": run_id}), completed, spec)


def standard_figures(database_url: str, run_id: str, final_stage: str, produced: int, ai_limit: int,
                     per_partition: list[int], limits: capacity.Limits | None = None
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """measure.figures.run_figures of a run from its rows, and the rows' extras the benchmark
    adds (completion times, 'ok' calls, latencies, the span's ends); `final_stage` is the spec's
    completing stage, `limits` the endpoints' (`limits_of`; by default one per stage at ai_limit)."""
    run = {"run": run_id}
    status = dict(rows(database_url, "SELECT status, count(*) FROM requests WHERE run_id = %s "
                        "GROUP BY status", (run_id,)))
    first, last = (_float(v) for v in rows(database_url, SPAN_SQL, run)[0])
    times = completion_times(database_url, run_id, final_stage)
    spans = [(stage, partition, float(started), float(ended))
             for stage, partition, started, ended in rows(database_url, OK_CALLS_SQL, run)]
    calls = [(stage, partition, ended - started) for stage, partition, started, ended in spans]
    band = figures.steady_band(times)
    per_stage: dict[str, list[float]] = defaultdict(list)
    for stage, _, seconds in calls:
        per_stage[stage].append(seconds)
    repeated = [n for (n,) in rows(database_url, REPEATED_CALLS_SQL, run)]
    latency = [(float(e2e), {stage: float(s) for stage, s in per_stage.items()} if per_stage else None)
               for e2e, per_stage in rows(database_url, LATENCY_SQL, run)]
    e2e = [e for e, _ in latency]
    max_over_mean, cv = figures.skew(per_partition)
    standard = figures.run_figures(
        produced=produced, status=status, span=figures.span_s(first, last),
        steady_throughput_rps=figures.steady_rate(times),
        service_s={stage: statistics.fmean(s) for stage, s in per_stage.items()}, ai_limit=ai_limit,
        ok_calls={stage: len(s) for stage, s in per_stage.items()},
        band_work=capacity.band_work(((stage, a, b) for stage, _, a, b in spans), band), band=band,
        limits=limits, duplicate_ai_calls=figures.beyond_first(repeated), skew_max_over_mean=max_over_mean,
        skew_cv=cv, skew_records=sum(per_partition), skew_partitions=len(per_partition),
        latency_s={q: figures.percentile(e2e, q) for q in figures.QUANTILES})
    extras = {"first_produced_s": first, "last_terminal_s": last, "completion_times": times,
              "calls": calls, "per_stage": per_stage, "latency": latency}
    return standard, extras


def burst_figures(pipeline: Pipeline, run_id: str, count: int, ai_limit: int,
                  timeout_s: float) -> dict[str, Any]:
    """Send a burst through a running deployment under a run id of its own (same topics and
    fleets), wait until each request settled, and return its standard figures (skew from the
    partitions the source's events on the spec's measured topic landed on)."""
    run = replace(pipeline, run_id=run_id)
    sent = run.send(count)
    run.wait_terminal(count, timeout_s)
    per_partition = sent.per_partition(pipeline.config.partitions)
    spec = pipeline.topics.spec
    return standard_figures(pipeline.database_url, run_id, spec.completing_stage, len(sent.request_ids),
                            ai_limit, per_partition, limits_of(spec, ai_limit, pipeline.config.time_scale))[0]
