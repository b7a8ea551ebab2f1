"""The gate page inside the Airflow UI: what the promotion gate decided, and why.

A FastAPI app that the `gate_ui_plugin` plugin mounts on the API server under /pipeline-gate. It
shows the active configuration of each pipeline, regression alarms raised by re-measurements of
an active version, the latest gate decisions (of every pipeline, or of the one chosen with
`?pipeline=`) with the pipeline each was for, capacity, throughput and utilization (mean and 95%
bounds over the trials), the AI cost (measure.cost), every check (measured against required)
and each trial's skew with its diagnosis (why a partition is hot and what to do: measure.skew),
the promotion history and the plots of the most recent run, the capacity searches (max
sustainable rate per version), and serves the same decisions as JSON at
/pipeline-gate/api/decisions (also `?pipeline=`). Reading needs an Airflow login with read
access to the runs of `pipeline_tuning` (the UI's session cookie or a bearer token), because the
page sits on the same server as the REST API. Its *Roll back* form triggers `pipeline_rollback`
through that REST API from the browser, with the user's own login: Airflow checks the user may
trigger it.

Failures as an operator meets them are on the same page: dead letters counted by pipeline, stage
and reason (of a run or run-id prefix with `?run=`), a *Redrive* form that triggers
`pipeline_redrive` the same way as *Roll back*, and each AI endpoint's circuit.

So are the provider quotas the pipelines share (pipeline_ops.quota_page): each quota's limits,
each pipeline's grant, calls in use and fair share, its lapsed holders, the backlog of each lane
and a plot of the grants over the last minutes (`?quota_minutes=`, 10 by default), with the same
figures as JSON at /pipeline-gate/api/quotas.

And the canaries on live traffic (pipeline_ops.canary_page): the latest canaries with each
step's share, window, verdict and decision, its checks with the candidate's figure beside the
baseline's and the quota share, and a plot per canary of both sides' completions and latency,
with the same figures as JSON at /pipeline-gate/api/canaries.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.providers.postgres.hooks.postgres import PostgresHook
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from consumers.config import pipeline_spec
from consumers.config.candidate import PipelineConfig
from measure import cost
from pipeline_ops import canary_page, quota_page
from pipeline_ops.registry import ConfigRegistry

CONN_ID = "postgres_default"
DAG_ID = "pipeline_tuning"
ROLLBACK_DAG_ID = "pipeline_rollback"
REDRIVE_DAG_ID = "pipeline_redrive"
MOUNT = "/pipeline-gate"  # where gate_ui_plugin mounts this app
PLOTS = ("completions.png", "requests_per_partition.png")
# Run ids are made by the resolve task (e.g. tuning-20261122t084146-v1); anything else is refused
# before it gets near the file system.
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")

_templates = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                         autoescape=select_autoescape(["html"]))
_templates.filters["cost"] = cost.shown

app = FastAPI(title="Pipeline gate", description="Gate decisions, active version and promotions.",
              dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN, DAG_ID))])
app.include_router(quota_page.routes(CONN_ID))
app.include_router(canary_page.routes(CONN_ID))


def results_dir() -> Path:
    """Where the report task writes `results/<run id>/` (same rule as pipeline_ops.report, which is
    not imported here so the API server does not load matplotlib)."""
    default = Path(__file__).resolve().parents[2] / "results"
    return Path(os.environ.get("PIPELINE_RESULTS_DIR", default)).resolve()


def decisions(hook: PostgresHook, limit: int = 20, run_id: str | None = None,
              pipeline: str | None = None) -> list[dict[str, Any]]:
    """The latest gate decisions, newest first, with the candidate's name and pipeline."""
    rows = hook.get_records(
        "SELECT d.id, d.run_id, d.candidate, c.name, c.pipeline, d.active_before, d.passed, d.reasons, "
        "d.figures, d.thresholds, d.decided_at FROM gate_decisions d "
        "JOIN configurations c ON c.version = d.candidate "
        "WHERE (%(run_id)s::text IS NULL OR d.run_id = %(run_id)s) "
        "AND (%(pipeline)s::text IS NULL OR c.pipeline = %(pipeline)s) "
        "ORDER BY d.decided_at DESC, d.id DESC LIMIT %(limit)s",
        parameters={"run_id": run_id, "pipeline": pipeline, "limit": limit})
    keys = ("id", "run_id", "version", "name", "pipeline", "active_before", "passed", "reasons", "figures",
            "thresholds", "decided_at")
    return [_utc(dict(zip(keys, row, strict=True))) for row in rows]


def dead_letter_groups(hook: PostgresHook, pipeline: str | None = None, run: str | None = None,
                       by: Literal["latest", "count"] = "latest", limit: int = 50) -> list[dict[str, Any]]:
    """Dead letters counted by pipeline, stage and reason code (a reason reads `<code>: <detail>`;
    the code is what a redrive selects on), with the runs they came from, the latest one's time
    and how many went back (a redrive whose delivery the broker confirmed); the most recent group
    first, or the largest. `run` is a run id or a prefix of run ids, as the redrive DAG takes it."""
    rows = hook.get_records(
        "SELECT pipeline, stage, split_part(reason, ': ', 1), count(*), count(DISTINCT run_id), max(at), "
        "count(*) FILTER (WHERE EXISTS (SELECT FROM redrives x WHERE x.dead_letter_id = d.id "
        "AND x.outcome = 'redriven' AND x.sent_at IS NOT NULL)) "
        "FROM dead_letters d WHERE (%(pipeline)s::text IS NULL OR pipeline = %(pipeline)s) "
        "AND (%(run)s::text IS NULL OR starts_with(run_id, %(run)s)) GROUP BY 1, 2, 3 "
        "ORDER BY CASE WHEN %(by)s = 'count' THEN count(*) END DESC NULLS LAST, max(at) DESC, 1, 2, 3 "
        "LIMIT %(limit)s",
        parameters={"pipeline": pipeline, "run": run, "by": by, "limit": limit})
    keys = ("pipeline", "stage", "reason", "letters", "runs", "latest", "sent_back")
    return [_utc(dict(zip(keys, row, strict=True))) for row in rows]


def circuit_transitions(hook: PostgresHook, run: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Per run, stage and endpoint with a recorded transition: the latest one (the circuit's
    state since then) and how many times the circuit opened; the most recent first."""
    rows = hook.get_records(
        "SELECT run_id, stage, endpoint, state, detail, at, openings FROM ("
        "SELECT run_id, stage, endpoint, state, detail, at, "
        "count(*) FILTER (WHERE state = 'open') OVER w AS openings, "
        "row_number() OVER (w ORDER BY at DESC, id DESC) AS recency "
        "FROM endpoint_circuits WHERE %(run)s::text IS NULL OR starts_with(run_id, %(run)s) "
        "WINDOW w AS (PARTITION BY run_id, stage, endpoint)) c "
        "WHERE recency = 1 ORDER BY at DESC, run_id, stage LIMIT %(limit)s",
        parameters={"run": run, "limit": limit})
    keys = ("run_id", "stage", "endpoint", "state", "detail", "at", "openings")
    return [_utc(dict(zip(keys, row, strict=True))) for row in rows]


def deployed_endpoints(hook: PostgresHook, run: str | None = None) -> list[dict[str, Any]]:
    """The AI endpoint of each running fleet's stage, with when the fleet started: an endpoint
    whose circuit never moved is closed since then. A fleet whose configuration or pipeline spec
    cannot be read has no endpoint the page can name, and is left out."""
    rows = hook.get_records(
        "SELECT d.run_id, d.stage, c.config, d.started_at FROM deployments d "
        "JOIN configurations c USING (version) WHERE d.state = 'running' "
        "AND (%(run)s::text IS NULL OR starts_with(d.run_id, %(run)s))", parameters={"run": run})
    named = [(run_id, stage, _endpoint(config, stage), at) for run_id, stage, config, at in rows]
    return [_utc({"run_id": run_id, "stage": stage, "endpoint": endpoint, "started_at": at})
            for run_id, stage, endpoint, at in named if endpoint is not None]


def _endpoint(config: dict[str, Any], stage: str) -> str | None:
    """The endpoint a stage of a configuration calls, its work changes applied (None: no AI
    work, or no readable configuration or spec)."""
    try:
        spec = PipelineConfig.from_dict(config).spec
    except ValueError:  # a SpecError among them
        return None
    work = spec.stages[stage].work if stage in spec.stages else None
    return work.endpoint if isinstance(work, pipeline_spec.HttpWork) else None


def circuit_states(transitions: list[dict[str, Any]], deployed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each endpoint's circuit: its latest transition, or closed since its fleet started when it
    has none (no row, no opening; a stage calls one endpoint). Circuits that are not closed come
    first, then the most recent change."""
    moved = {(t["run_id"], t["stage"]) for t in transitions}
    quiet = {(d["run_id"], d["stage"]): {
        "run_id": d["run_id"], "stage": d["stage"], "endpoint": d["endpoint"], "state": "closed",
        "detail": "no transition since the fleet started", "at": d["started_at"], "openings": 0}
        for d in deployed if (d["run_id"], d["stage"]) not in moved}
    return sorted([*transitions, *quiet.values()],
                  key=lambda c: (c["state"] == "closed", -c["at"].timestamp(), c["run_id"], c["stage"]))


def plot_path(run_id: str, name: str) -> Path | None:
    """The plot file of a run, or None when the names are not a known plot inside the results dir."""
    if name not in PLOTS or not RUN_ID.match(run_id):
        return None
    root = results_dir()
    path = (root / run_id / name).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        return None
    return path


def _utc(row: dict[str, Any]) -> dict[str, Any]:
    """Timestamps in UTC whatever the database session's time zone, as the page labels them."""
    return {k: v.astimezone(UTC) if isinstance(v, datetime) else v for k, v in row.items()}


def _jsonable(decision: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in decision.items()}


@app.get("/api/decisions")
def api_decisions(limit: Annotated[int, Query(ge=1, le=500)] = 20, run_id: str | None = None,
                  pipeline: str | None = None) -> list[dict[str, Any]]:
    """The latest decisions as stored by the gate (reasons, figures and thresholds as JSON)."""
    return [_jsonable(d) for d in decisions(PostgresHook(postgres_conn_id=CONN_ID), limit, run_id, pipeline)]


@app.get("/results/{run_id}/{name}", name="plot")
def plot(run_id: str, name: str) -> FileResponse:
    """A plot written by the report task; only the known PNGs under the results dir are served."""
    path = plot_path(run_id, name)
    if path is None:
        raise HTTPException(status_code=404, detail="no such plot")
    return FileResponse(path, media_type="image/png")


@app.get("/", response_class=HTMLResponse)
def page(request: Request, limit: Annotated[int, Query(ge=1, le=500)] = 20,
         pipeline: str | None = None, run: str | None = None,
         letters_by: Literal["latest", "count"] = "latest",
         quota_minutes: quota_page.Minutes = quota_page.MINUTES) -> HTMLResponse:
    """The server-rendered page the navigation link opens; `pipeline` shows only its decisions and
    dead letters, `run` (a run id or prefix) only the dead letters and circuits of those runs,
    `quota_minutes` how far back the quotas' plots go."""
    hook = PostgresHook(postgres_conn_id=CONN_ID)
    pipeline, run = pipeline or None, run or None
    registry = ConfigRegistry(CONN_ID)
    rows = decisions(hook, limit, pipeline=pipeline)
    latest = rows[0]["run_id"] if rows else None
    plots = [{"name": name, "url": request.url_for("plot", run_id=latest, name=name).path}
             for name in PLOTS if latest and plot_path(latest, name)]
    quotas = quota_page.quotas(hook)
    canaries = canary_page.canaries(hook)
    html = _templates.get_template("gate.html").render(
        decisions=rows, actives=registry.actives(), pipelines=registry.pipelines(), pipeline=pipeline,
        history=[_utc(h) for h in registry.history()],
        alarms=[_utc(a) for a in registry.alarms()], versions=registry.versions(),
        capacity=[_utc(c) for c in registry.capacity_searches()], latest=latest,
        plots=plots, results_dir=results_dir(), api_base=api_base(request),
        rollback_dag=ROLLBACK_DAG_ID, redrive_dag=REDRIVE_DAG_ID, run=run, letters_by=letters_by,
        dead_letters=dead_letter_groups(hook, pipeline, run, letters_by),
        circuits=circuit_states(circuit_transitions(hook, run), deployed_endpoints(hook, run)),
        quotas=quotas, quota_minutes=quota_minutes,
        quota_windows={m: f"?{request.url.include_query_params(quota_minutes=m).query}#quotas"
                       for m in quota_page.WINDOWS},
        quota_plots={q["quota"]: request.url_for("quota_plot", quota=q["quota"]).path for q in quotas},
        canaries=canaries,
        canary_plots={c["id"]: request.url_for("canary_plot", canary_id=c["id"]).path for c in canaries})
    return HTMLResponse(html)


def api_base(request: Request) -> str:
    """The Airflow server's root path as the browser sees it (this app is mounted below it)."""
    return request.scope.get("root_path", "").removesuffix(MOUNT)
