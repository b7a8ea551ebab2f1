"""The shared quotas on the gate page: how the fleets of the pipelines on one provider quota
divide it now, what each pipeline is due, who waits, and the grants over time.

Read from the tables the holders renew (`quota_limits`, `quota_claims`, `quota_history`; the
rules are consumers.quota.leases'). A claim whose lease holds is live: its demand takes part in
the sharing and its grant is the pipeline's. One whose lease lapsed (its holder was killed or
lost the database) gets no new share but is shown, and still counts against the quota, until
`released_at`. The fair share is `measure.quota_share.fair_allocation` over the live pipelines'
demands and weights, one lane at a time as if the lane had the whole quota: the allocator
serves the lanes in strict priority after their reserves, which only the quota files hold, so
a lower lane gets less while a higher one is busy.

Routes (`routes`, on the gate app): the figures as JSON at /api/quotas, and a quota's grants and
calls in use over the last minutes at /quotas/<quota>/plot.png, drawn on request (matplotlib is
imported then, not when the API server loads this module).
"""

from __future__ import annotations

import io
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

from airflow.providers.postgres.hooks.postgres import PostgresHook
from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from consumers.config.pipeline_spec.quota import LANES
from consumers.quota.leases import DIMENSIONS
from measure.quota_share import fair_allocation

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MINUTES = 10  # the plot's window by default
WINDOWS = (5, MINUTES, 30, 60)  # the windows the page offers (any other: `?quota_minutes=`)
Minutes = Annotated[int, Query(ge=1, le=24 * 60)]
POINTS = 240  # about as many points as the plot's window is cut into
MIN_STEP_S = 2  # a few renewals (every 0.5 s) per point, so no live holder falls between two

# The limits of DIMENSIONS in their order (NULL: not metered).
LIMITS_SQL = ("SELECT quota, concurrency, requests_per_minute, tokens_per_minute, updated_at "
              "FROM quota_limits ORDER BY quota")
# Every claim that still counts; `live`: its lease holds (the database's clock decides, as for
# the holders).
CLAIMS_SQL = (
    "SELECT quota, holder, pipeline, stage, run_id, lane, weight, demand_calls, demand_requests, "
    "demand_tokens, granted_calls, granted_requests, granted_tokens, in_use, expires_at, released_at, "
    "expires_at > now() FROM quota_claims WHERE released_at > now() ORDER BY quota, pipeline, holder")
CLAIM_KEYS = ("quota", "holder", "pipeline", "stage", "run_id", "lane", "weight", "demand_calls",
              "demand_requests", "demand_tokens", "granted_calls", "granted_requests", "granted_tokens",
              "in_use", "expires_at", "released_at", "live")
# Per pipeline and point of the window: its holders' grants and calls out summed, each holder's
# latest renewal in the point's step counting once.
HISTORY_SQL = (
    "WITH renewals AS (SELECT holder, pipeline, at, granted_calls, in_use, "
    "to_timestamp(floor(extract(epoch FROM at) / %(step)s) * %(step)s) AS point FROM quota_history "
    "WHERE quota = %(quota)s AND at > now() - make_interval(mins => %(minutes)s)) "
    "SELECT point, pipeline, sum(granted_calls), sum(in_use) FROM ("
    "SELECT DISTINCT ON (holder, point) point, pipeline, granted_calls, in_use FROM renewals "
    "ORDER BY holder, point, at DESC) latest GROUP BY point, pipeline ORDER BY point, pipeline")


def quotas(hook: PostgresHook) -> list[dict[str, Any]]:
    """Every quota in `quota_limits` with its figures (`figures`), by name."""
    claims = [dict(zip(CLAIM_KEYS, row, strict=True)) for row in hook.get_records(CLAIMS_SQL)]
    return [figures(row, [c for c in claims if c["quota"] == row[0]]) for row in hook.get_records(LIMITS_SQL)]


def figures(limits: tuple, claims: list[dict[str, Any]]) -> dict[str, Any]:
    """One quota: its limits (the metered ones); its pipelines (`pipelines`) with their fair
    shares; the grants and calls in use that count against it, lapsed holders' too; and the
    backlog of each lane."""
    name, *capacities, updated_at = limits
    metered = {d: c for d, c in zip(DIMENSIONS, capacities, strict=True) if c is not None}
    shown = pipelines(metered, claims)
    lanes = list(dict.fromkeys(p["lane"] for p in shown))
    for lane in lanes:
        _fair_shares(metered, [p for p in shown if p["lane"] == lane and p["holders"]])
    return {"quota": name, "limits": metered, "updated_at": updated_at.astimezone(UTC),
            "granted": {d: sum(c[f"granted_{d}"] for c in claims) for d in metered},
            "in_use": sum(c["in_use"] for c in claims),
            "lapsed_granted": {d: sum(c[f"granted_{d}"] for c in claims if not c["live"]) for d in metered},
            "pipelines": shown,
            "backlog": [{"lane": lane, "waiting": _waiting([p for p in shown if p["lane"] == lane])}
                        for lane in lanes]}


def pipelines(metered: dict[str, float], claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pipeline (lanes by priority, then by name): its live holders' demand, grant and calls
    in use summed, and its lapsed holders apart; `fair` is left for `figures` to fill."""
    by_name: dict[str, dict[str, Any]] = {}
    for claim in claims:
        p = by_name.setdefault(claim["pipeline"], {
            "pipeline": claim["pipeline"], "lane": claim["lane"], "weight": claim["weight"], "holders": 0,
            "demand": dict.fromkeys(metered, 0.0), "granted": dict.fromkeys(metered, 0.0), "in_use": 0,
            "fair": {}, "lapsed": []})
        if not claim["live"]:
            p["lapsed"].append({
                "holder": claim["holder"], "stage": claim["stage"], "run_id": claim["run_id"],
                "granted": {d: claim[f"granted_{d}"] for d in metered}, "in_use": claim["in_use"],
                "expires_at": claim["expires_at"].astimezone(UTC),
                "released_at": claim["released_at"].astimezone(UTC)})
            continue
        p["holders"] += 1
        p["lane"], p["weight"] = claim["lane"], claim["weight"]  # a live claim's are the ones in force
        p["in_use"] += claim["in_use"]
        for d in metered:
            p["demand"][d] += claim[f"demand_{d}"]
            p["granted"][d] += claim[f"granted_{d}"]
    rank = {lane: i for i, lane in enumerate(LANES)}
    return sorted(by_name.values(),
                  key=lambda p: (rank.get(p["lane"], len(LANES)), p["lane"], p["pipeline"]))


def _fair_shares(metered: dict[str, float], live: list[dict[str, Any]]) -> None:
    """Each live pipeline's weighted max-min fair share of every metered dimension, in `fair`."""
    if not live:
        return
    weights = {p["pipeline"]: p["weight"] for p in live}
    for d, capacity in metered.items():
        shares = fair_allocation(capacity, weights, {p["pipeline"]: p["demand"][d] for p in live})
        for p in live:
            p["fair"][d] = shares[p["pipeline"]]


def _waiting(pipelines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The live pipelines asking for more than they are granted, with demand − grant where they do."""
    waiting = []
    for p in pipelines:
        short = {d: p["demand"][d] - p["granted"][d] for d in p["demand"]}
        if p["holders"] and (more := {d: x for d, x in short.items() if x > 1e-9}):
            waiting.append({"pipeline": p["pipeline"], "waiting": more})
    return waiting


def history(hook: PostgresHook, quota: str, minutes: int) -> dict[str, dict[str, list[Any]]]:
    """Per pipeline over the last `minutes`: the points' times (UTC), calls granted and calls in use."""
    step = max(MIN_STEP_S, minutes * 60 // POINTS)
    series: dict[str, dict[str, list[Any]]] = defaultdict(lambda: {"at": [], "granted": [], "in_use": []})
    for at, pipeline, granted, in_use in hook.get_records(
            HISTORY_SQL, parameters={"quota": quota, "minutes": minutes, "step": step}):
        s = series[pipeline]
        s["at"].append(at.astimezone(UTC))
        s["granted"].append(int(granted))
        s["in_use"].append(int(in_use))
    return dict(series)


def figure(quota: str, concurrency: int | None, series: dict[str, dict[str, list[Any]]], minutes: int,
           end: datetime) -> Figure:
    """Each pipeline's calls granted (solid) and in use (dashed, the same colour) over the window
    ending at `end`, against the quota's concurrency. A Figure of its own, not pyplot's: the
    app serves requests on several threads, pyplot's figures are global, and a Figure prints its
    PNG with Agg whatever backend is selected."""
    from matplotlib.dates import DateFormatter, date2num
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.6))
    ax = fig.subplots()
    for i, (pipeline, s) in enumerate(sorted(series.items())):
        ax.step(s["at"], s["granted"], where="post", color=f"C{i}", linewidth=1.4,
                label=f"{pipeline} granted")
        ax.step(s["at"], s["in_use"], where="post", color=f"C{i}", linewidth=1, linestyle="--",
                label=f"{pipeline} in use")
    if concurrency is not None:
        ax.axhline(concurrency, color="grey", linestyle=":", linewidth=1, label=f"concurrency {concurrency}")
    if not series:
        ax.text(0.5, 0.5, "no renewal in this window", transform=ax.transAxes, ha="center", color="grey")
    ax.set_xlim(date2num(end - timedelta(minutes=minutes)), date2num(end))
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_formatter(DateFormatter("%H:%M:%S", tz=UTC))
    ax.set(xlabel="UTC", ylabel="calls at once", title=f"quota {quota}: the last {minutes} minutes")
    ax.legend(fontsize=7, loc="upper left", ncols=2)
    fig.tight_layout()
    return fig


def routes(conn_id: str) -> APIRouter:
    """The quota routes, reading through the `conn_id` connection."""
    router = APIRouter()

    @router.get("/api/quotas")
    def api_quotas() -> list[dict[str, Any]]:
        """Every quota's figures as the page shows them (timestamps in ISO 8601, UTC)."""
        return quotas(PostgresHook(postgres_conn_id=conn_id))

    @router.get("/quotas/{quota}/plot.png", name="quota_plot", response_class=Response)
    def quota_plot(quota: str, minutes: Minutes = MINUTES) -> Response:
        """The quota's calls granted and in use per pipeline over the last `minutes`, as a PNG."""
        hook = PostgresHook(postgres_conn_id=conn_id)
        concurrency = {row[0]: row[1] for row in hook.get_records(LIMITS_SQL)}
        if quota not in concurrency:
            raise HTTPException(status_code=404, detail="no such quota")
        fig = figure(quota, concurrency[quota], history(hook, quota, minutes), minutes, datetime.now(UTC))
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        return Response(png.getvalue(), media_type="image/png")

    return router
