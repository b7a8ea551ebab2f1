"""The canaries on the gate page: what each recent canary tried, how each of its steps was judged
against the active version, and the two sides' traffic over its minutes.

Read from the rows `pipeline_ops.canary` writes (`canaries`, `canary_steps`; a judged step's
`figures` are `measure.canary.Verdict.to_dict()`, a step that failed before judging has only a
`reason`) and from the run's own rows: a stage result says which side handled it through its
member (`fleet_members`: the canary's fleets carry its id, the active group's none), as the
judge's samples do (`consumers.runs.canary_samples`). This module imports neither: they bring
the Kafka client and the run drivers, which the API server does not need to draw a page.

Routes (`routes`, on the gate app): the figures as JSON at /api/canaries, and a canary's
completions and median latency per side over its span (a point a second) at /canaries/<id>/plot.png, drawn on
request (matplotlib is imported then, not when the API server loads this module).
"""

from __future__ import annotations

import io
import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow.providers.postgres.hooks.postgres import PostgresHook
from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LIMIT = 10  # the canaries the page shows, the latest first
SIDES = ("active", "candidate")
SHADES = {"pass": "tab:green", "marginal": "tab:orange", "fail": "tab:red"}  # a step's window by verdict

# The latest canaries (or the one `id`), with both versions' names.
CANARIES_SQL = (
    "SELECT k.id, k.pipeline, k.run_id, k.active_version, a.name, k.candidate_version, c.name, k.stages, "
    "k.state, k.reason, k.started_at, k.ended_at FROM canaries k "
    "JOIN configurations a ON a.version = k.active_version "
    "JOIN configurations c ON c.version = k.candidate_version "
    "WHERE %(id)s::bigint IS NULL OR k.id = %(id)s ORDER BY k.started_at DESC, k.id DESC LIMIT %(limit)s")
CANARY_KEYS = ("id", "pipeline", "run_id", "active_version", "active_name", "candidate_version",
               "candidate_name", "stages", "state", "reason", "started_at", "ended_at")
STEPS_SQL = ("SELECT canary_id, step, share, partitions, started_at, ended_at, verdict, decision, figures "
             "FROM canary_steps WHERE canary_id = ANY(%(ids)s) ORDER BY canary_id, step")
# Per point and side of a canary's span: the changed stages' completions, and the median
# end-to-end latency of the requests they completed (a request counts once per changed stage;
# the median leaves out those not yet notified).
SERIES_SQL = (
    "SELECT to_timestamp(floor(extract(epoch FROM s.completed_at) / %(step)s) * %(step)s), "
    "f.canary IS NOT NULL, count(*), "
    "percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM r.notified_at - r.produced_at)) "
    "FROM stage_results s JOIN fleet_members f USING (run_id, member) "
    "JOIN requests r ON r.pipeline = s.pipeline AND r.request_id = s.request_id "
    "WHERE s.run_id = %(run)s AND s.stage = ANY(%(stages)s) AND (f.canary IS NULL OR f.canary = %(canary)s) "
    "AND s.completed_at >= %(start)s AND s.completed_at < %(end)s GROUP BY 1, 2 ORDER BY 1, 2")
# A point a second up to an hour's span (a canary's steps and reviews take less); beyond, as
# for a canary its dead run left running, wider points, so the plot stays this many.
MAX_POINTS = 3600


def canaries(hook: PostgresHook, canary_id: int | None = None, limit: int = LIMIT) -> list[dict[str, Any]]:
    """The latest canaries (or only `canary_id`), newest first, each with its steps (`step`)."""
    found = [_utc(dict(zip(CANARY_KEYS, row, strict=True)))
             for row in hook.get_records(CANARIES_SQL, parameters={"id": canary_id, "limit": limit})]
    if not found:
        return []
    steps = hook.get_records(STEPS_SQL, parameters={"ids": [c["id"] for c in found]})
    return [{**c, "steps": [step(row) for row in steps if row[0] == c["id"]]} for c in found]


def step(row: tuple) -> dict[str, Any]:
    """One step: its share, the partitions lent, its window, verdict and decision; a judged
    step's checks (candidate's figure against the baseline's) and quota share, as the judge
    stored them, or why it failed before it could be judged. A step still measuring (or whose
    run died before judging it) has neither."""
    _, number, share, partitions, started_at, ended_at, verdict, decision, figures = row
    return _utc({"step": number, "share": share, "partitions": partitions, "started_at": started_at,
                 "ended_at": ended_at, "verdict": verdict, "decision": decision,
                 "checks": figures.get("checks", []), "quota_share": figures.get("quota_share", {}),
                 "reason": figures.get("reason")})


def series(hook: PostgresHook, canary: dict[str, Any], end: datetime) -> dict[str, dict[str, list[Any]]]:
    """Per side, every point (a second, or wider past MAX_POINTS seconds) from the canary's start
    to `end` (UTC): the changed stages' completions per second (0 at a point without any, so a
    side that holds no partition reads 0 rather than a line drawn across) and their median
    latency in seconds (NaN there: a gap)."""
    width = max(1, math.ceil((end - canary["started_at"]).total_seconds() / MAX_POINTS))
    rows = hook.get_records(SERIES_SQL, parameters={
        "run": canary["run_id"], "stages": canary["stages"], "canary": canary["id"],
        "start": canary["started_at"], "end": end, "step": width})
    found = {(at.astimezone(UTC), "candidate" if candidate else "active"):
             (n / width, math.nan if median is None else float(median)) for at, candidate, n, median in rows}
    first = math.floor(canary["started_at"].timestamp() / width) * width
    points = [datetime.fromtimestamp(first + i * width, UTC)
              for i in range(math.floor((end.timestamp() - first) / width) + 1)]
    idle = (0.0, math.nan)
    return {side: {"at": points, "completions": [found.get((t, side), idle)[0] for t in points],
                   "median_latency_s": [found.get((t, side), idle)[1] for t in points]}
            for side in SIDES}


def figure(canary: dict[str, Any], series: dict[str, dict[str, list[Any]]], end: datetime) -> Figure:
    """Both sides' completions per second (top) and median latency (bottom) from the canary's
    start to `end`, each step's analysis window shaded by its verdict (grey while measuring)
    and its start marked with its share. A Figure of its own, not pyplot's (see
    quota_page.figure)."""
    from matplotlib.dates import DateFormatter, date2num
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    completions, latency = fig.subplots(2, 1, sharex=True)
    labels = {"active": f"active v{canary['active_version']}",
              "candidate": f"candidate v{canary['candidate_version']}"}
    for i, side in enumerate(SIDES):
        s = series[side]
        completions.plot(s["at"], s["completions"], color=f"C{i}", linewidth=1, label=labels[side])
        # Marked: a point between two without completions (a side holding few partitions) has
        # no line to it.
        latency.plot(s["at"], s["median_latency_s"], color=f"C{i}", linewidth=1, marker=".", markersize=3,
                     label=labels[side])
    for st in canary["steps"]:
        for ax in (completions, latency):
            ax.axvspan(date2num(st["started_at"]), date2num(st["ended_at"] or end),
                       color=SHADES.get(st["verdict"], "grey"), alpha=0.2, linewidth=0)
            ax.axvline(date2num(st["started_at"]), color="grey", linestyle=":", linewidth=1)
        completions.annotate(f"step {st['step']}: {st['share']:.0%}", (date2num(st["started_at"]), 1),
                             xycoords=("data", "axes fraction"), xytext=(2, -10), textcoords="offset points",
                             fontsize=7, color="dimgrey")
    completions.set_xlim(date2num(canary["started_at"]), date2num(end))
    completions.set_ylim(bottom=0)
    latency.set_ylim(bottom=0)
    latency.xaxis.set_major_formatter(DateFormatter("%H:%M:%S", tz=UTC))
    completions.set(ylabel="completions / s",
                    title=f"canary {canary['id']}: {canary['pipeline']} {', '.join(canary['stages'])}")
    latency.set(xlabel="UTC", ylabel="median latency (s)")
    completions.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def _utc(row: dict[str, Any]) -> dict[str, Any]:
    """Timestamps in UTC whatever the database session's time zone, as the page labels them."""
    return {k: v.astimezone(UTC) if isinstance(v, datetime) else v for k, v in row.items()}


def routes(conn_id: str) -> APIRouter:
    """The canary routes, reading through the `conn_id` connection."""
    router = APIRouter()

    @router.get("/api/canaries")
    def api_canaries() -> list[dict[str, Any]]:
        """The latest canaries as the page shows them (timestamps in ISO 8601, UTC)."""
        return canaries(PostgresHook(postgres_conn_id=conn_id))

    @router.get("/canaries/{canary_id}/plot.png", name="canary_plot", response_class=Response)
    def canary_plot(canary_id: int) -> Response:
        """The canary's two sides over its span (until now while it runs), as a PNG."""
        hook = PostgresHook(postgres_conn_id=conn_id)
        found = canaries(hook, canary_id, limit=1)
        if not found:
            raise HTTPException(status_code=404, detail="no such canary")
        canary = found[0]
        end = canary["ended_at"] or datetime.now(UTC)
        png = io.BytesIO()
        figure(canary, series(hook, canary, end), end).savefig(png, format="png", dpi=100)
        return Response(png.getvalue(), media_type="image/png")

    return router
