"""Dead-letter triage: what was dead-lettered since the previous triage, counted by pipeline,
stage and reason; the pipelines past the alarm threshold; the `ai_unavailable` letters to send
back once their endpoint's circuit is closed again (schema: infra/migrations/0013_triage.sql).

**Every dead letter is counted by exactly one triage**, whatever wakes triages up and however
often, because a triage reads the table, never the wake-up event: it counts the rows of
`dead_letters` above the highest id the previous triage counted and records its own high mark in
`triage_runs`, in one transaction that first takes `LOCK TABLE dead_letters IN SHARE MODE`. Ids
are drawn when a row is inserted, not when it commits, so without the lock a row with a lower id
could commit after a higher one was counted and stay below the mark for good; the lock waits for
the transactions writing dead letters to commit and holds new ones back for the milliseconds of
one grouped count, so every id up to the mark has been counted. `triage_runs` is locked too, so
two triages (runs may overlap) count one after the other, never the same letter twice, and a
retried task finds its run's row instead of counting again.

**The alarm is per pipeline**: a pipeline with more than `threshold` new dead letters in one
triage (one burst) is a team's outage or bad release, not the scattered poison every pipeline
has. It is raised twice: in the triage's row (`alarms`, for pages and queries) and as a failed
task that logs an ERROR naming the pipelines and counts, so Airflow's own failure alerting (a
failed run in the grid, `on_failure_callback`, e-mail) reaches whoever watches the platform.

**Redrive**: `ai_unavailable` letters are grouped by pipeline, run and stage and go back through
the `pipeline_redrive` DAG (its selection, limit and bookkeeping) once every endpoint of that
run's stage has a closed circuit: its latest `endpoint_circuits` row is `closed`, or it has none
(the circuit never opened). The letter's request failed while the endpoint served others, so a
try later is worth it; the redrive's per-record limit bounds how often.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow.sdk.exceptions import AirflowFailException

from pipeline_ops.connections import transaction

log = logging.getLogger(__name__)

AI_UNAVAILABLE = "ai_unavailable"  # the dead-letter reason of a request the endpoint kept failing
DEFAULT_THRESHOLD = 100
LOCK_TIMEOUT = "10s"  # a writer stuck in a transaction fails the task (and its retry) instead


@dataclass(frozen=True, order=True)
class Group:
    """New dead letters of one run's stage with one reason (`dead_letters.reason` is
    `<reason>: <detail>`): the grain the table is read at."""

    pipeline: str
    run_id: str
    stage: str
    reason: str
    letters: int
    since: datetime  # the earliest of them


def counts(groups: Iterable[Group]) -> list[dict[str, Any]]:
    """New dead letters by pipeline, stage and reason (runs added up), in that order."""
    totals: Counter[tuple[str, str, str]] = Counter()
    for g in groups:
        totals[(g.pipeline, g.stage, g.reason)] += g.letters
    return [{"pipeline": p, "stage": s, "reason": r, "letters": n} for (p, s, r), n in sorted(totals.items())]


def alarms(counted: Iterable[dict[str, Any]], threshold: int) -> dict[str, int]:
    """The pipelines with more than `threshold` new dead letters, with their number."""
    per_pipeline: Counter[str] = Counter()
    for c in counted:
        per_pipeline[c["pipeline"]] += c["letters"]
    return {p: n for p, n in sorted(per_pipeline.items()) if n > threshold}


def redrives(groups: Iterable[Group]) -> list[dict[str, Any]]:
    """The `ai_unavailable` letters to send back, one entry per pipeline, run and stage."""
    chosen = sorted(g for g in groups if g.reason == AI_UNAVAILABLE)
    return [{"pipeline": g.pipeline, "run": g.run_id, "stage": g.stage, "letters": g.letters,
             "since": g.since.isoformat()} for g in chosen]


def redrive_conf(redrive: dict[str, Any]) -> dict[str, Any]:
    """The `pipeline_redrive` run for one entry of `redrives`: that run's stage, that reason, from
    the earliest of the letters on and no more of them than this triage counted."""
    return {"pipeline": redrive["pipeline"], "run": redrive["run"], "stages": [redrive["stage"]],
            "reasons": [AI_UNAVAILABLE], "since": redrive["since"], "until": "", "limit": redrive["letters"]}


def circuit_closed(latest_states: Iterable[str]) -> bool:
    """Whether a stage's endpoints all answer again: each one's latest circuit state is closed
    (no state at all: the circuit never opened)."""
    return all(state == "closed" for state in latest_states)


def raise_alarms(summary: dict[str, Any]) -> None:
    """Fail (without retry) when the triage found pipelines past the threshold."""
    if summary["alarms"]:
        found = ", ".join(f"{p}: {n}" for p, n in summary["alarms"].items())
        log.error("dead letters past the alarm threshold of %d per burst: %s", summary["threshold"], found)
        raise AirflowFailException(f"dead letters past the threshold of {summary['threshold']}: {found}")
    log.info("%d new dead letter(s), no pipeline past the threshold of %d", summary["letters"],
             summary["threshold"])


_SUMMARY = ("id", "after_id", "through_id", "letters", "counts", "threshold", "alarms", "redrives")


class Triage:
    """Reads `dead_letters` and `endpoint_circuits`, writes `triage_runs`, through the
    `postgres_default` connection (or another)."""

    def __init__(self, postgres_conn_id: str = "postgres_default") -> None:
        self.hook = PostgresHook(postgres_conn_id=postgres_conn_id)

    def count_new(self, dag_run_id: str, threshold: int = DEFAULT_THRESHOLD) -> dict[str, Any]:
        """Count the dead letters no triage has counted, record it, and return the summary (the
        recorded one when this run already counted)."""
        with transaction(self.hook) as cur:
            cur.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cur.execute("LOCK TABLE triage_runs IN SHARE ROW EXCLUSIVE MODE")
            cur.execute(f"SELECT {', '.join(_SUMMARY)} FROM triage_runs WHERE dag_run_id = %s", (dag_run_id,))
            done = cur.fetchone()
            if done is not None:
                return dict(zip(_SUMMARY, done, strict=True))
            cur.execute("LOCK TABLE dead_letters IN SHARE MODE")
            cur.execute("SELECT coalesce(max(through_id), 0) FROM triage_runs")
            after = cur.fetchone()[0]
            cur.execute("SELECT pipeline, run_id, stage, split_part(reason, ':', 1), count(*), min(at), "
                        "max(id) FROM dead_letters WHERE id > %s GROUP BY 1, 2, 3, 4", (after,))
            rows = cur.fetchall()
            groups = [Group(*row[:6]) for row in rows]
            counted = counts(groups)
            summary = {"after_id": after, "through_id": max((row[6] for row in rows), default=after),
                       "letters": sum(g.letters for g in groups), "counts": counted, "threshold": threshold,
                       "alarms": alarms(counted, threshold), "redrives": redrives(groups)}
            cur.execute("INSERT INTO triage_runs (dag_run_id, after_id, through_id, letters, counts, "
                        "threshold, alarms, redrives) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
                        (dag_run_id, after, summary["through_id"], summary["letters"], json.dumps(counted),
                         threshold, json.dumps(summary["alarms"]), json.dumps(summary["redrives"])))
            return {"id": cur.fetchone()[0], **summary}

    def closed(self, run_id: str, stage: str) -> bool:
        """Whether the run's stage has its endpoints' circuits closed (or never opened)."""
        rows = self.hook.get_records("SELECT DISTINCT ON (endpoint) state FROM endpoint_circuits "
                                     "WHERE run_id = %s AND stage = %s ORDER BY endpoint, at DESC, id DESC",
                                     parameters=(run_id, stage))
        return circuit_closed(state for (state,) in rows)

    def ready_redrives(self, summary: dict[str, Any]) -> tuple[bool, list[dict[str, Any]]]:
        """Whether every redrive of the triage can go now, and their `pipeline_redrive` confs."""
        waiting = [r for r in summary["redrives"] if not self.closed(r["run"], r["stage"])]
        for r in waiting:
            log.info("%s %s %s: circuit not closed yet, %d letter(s) wait", r["pipeline"], r["run"],
                     r["stage"], r["letters"])
        return not waiting, [redrive_conf(r) for r in summary["redrives"]]
