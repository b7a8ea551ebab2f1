"""PostgreSQL persistence of the pipeline's run records (schema in infra/migrations).

Results are idempotent by (request id, stage): `stage_results` has that primary key and every
write is `ON CONFLICT DO NOTHING`, so re-consumption never duplicates a result. `stage_claims`
makes sure at most one member calls the AI for a (request id, stage) at a time, and
`ai_attempts` keeps one row per try, written before it is sent, so every call is counted.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg2.extensions import connection
from psycopg2.pool import ThreadedConnectionPool

from consumers.failures import Transient


@dataclass(frozen=True)
class Origin:
    """Where a record came from: who processed which offset."""

    member: str
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class Claim:
    """The answer to a claim: the stage's recorded result, or whether the call is ours to make."""

    done: str | None = None
    ours: bool = False


class ClaimLost(Transient):
    """The lease ran out and another member took the claim over."""


def ts(epoch_s: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch_s, UTC) if epoch_s is not None else None


# What a stage result sets on the request row.
_REQUEST_UPDATES = {
    "check": "verdict = %(detail)s, checked_at = now(), "
             "status = CASE WHEN %(detail)s = 'approved' THEN 'generating' ELSE 'rejected' END",
    "generate": "result_url = %(detail)s, generated_at = now(), status = 'completed'",
}


class Storage:
    """A connection pool plus the pipeline's writes; safe to share between threads.

    All `pool_size` connections are opened up front and kept: psycopg2's pool closes every
    connection handed back beyond its minimum, which under concurrency means a new server
    process per transaction. Threads beyond `pool_size` wait for a free connection (the pool
    itself would raise), and transactions are short, so a few connections serve many workers.
    """

    def __init__(self, database_url: str, pool_size: int = 8) -> None:
        self._pool = ThreadedConnectionPool(pool_size, pool_size, database_url)
        self._free = threading.BoundedSemaphore(pool_size)

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        """One transaction. A connection that failed is closed rather than handed back: after a
        server restart it is dead, and the pool leaks its slot if rolling it back raises."""
        with self._free:
            conn: connection = self._pool.getconn()
            failed = True
            try:
                with conn, conn.cursor() as cur:
                    yield cur
                failed = False
            finally:
                self._pool.putconn(conn, close=failed)

    def close(self) -> None:
        self._pool.closeall()

    def start_run(self, run_id: str, scenario: str = "", params: dict | None = None) -> None:
        with self._tx() as cur:
            cur.execute("INSERT INTO runs (run_id, scenario, params) VALUES (%s, %s, %s) "
                        "ON CONFLICT (run_id) DO NOTHING",
                        (run_id, scenario, json.dumps(params or {})))

    def finish_run(self, run_id: str) -> None:
        with self._tx() as cur:
            cur.execute("UPDATE runs SET finished_at = now() WHERE run_id = %s", (run_id,))

    def record_intake(self, event: dict[str, Any], origin: Origin) -> bool:
        """The request row from the upload notification; True the first time only."""
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO requests (request_id, run_id, user_id, object_id, status, produced_at, "
                "received_at) VALUES (%s, %s, %s, %s, 'awaiting_style', %s, now()) "
                "ON CONFLICT (request_id) DO UPDATE SET user_id = EXCLUDED.user_id, "
                "object_id = EXCLUDED.object_id, produced_at = EXCLUDED.produced_at, "
                "received_at = COALESCE(requests.received_at, EXCLUDED.received_at)",
                (event["request_id"], event["run_id"], event["user_id"], event["object_id"],
                 ts(event["produced_at"])))
            return self._insert_result(cur, "intake", event, "ok", None, origin)

    def record_style(self, event: dict[str, Any]) -> None:
        """The user's style choice on the request row (it may arrive before the intake)."""
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO requests (request_id, run_id, status, style, description, styled_at) "
                "VALUES (%s, %s, 'checking', %s, %s, %s) ON CONFLICT (request_id) DO UPDATE SET "
                "style = EXCLUDED.style, description = EXCLUDED.description, "
                "styled_at = COALESCE(requests.styled_at, EXCLUDED.styled_at), "
                "status = CASE WHEN requests.status IN ('awaiting_style', 'checking') "
                "THEN 'checking' ELSE requests.status END",
                (event["request_id"], event["run_id"], event["style"], event["description"],
                 ts(event["produced_at"])))

    def record_result(self, stage: str, event: dict[str, Any], detail: str, origin: Origin) -> bool:
        """A stage's result, once; True when this call recorded it, False for a duplicate."""
        with self._tx() as cur:
            first = self._insert_result(cur, stage, event, "ok", detail, origin)
            if first:
                cur.execute(f"UPDATE requests SET {_REQUEST_UPDATES[stage]} "
                            "WHERE request_id = %(request_id)s",
                            {"detail": detail, "request_id": event["request_id"]})
            return first

    @staticmethod
    def _insert_result(cur: Any, stage: str, event: dict[str, Any], outcome: str,
                       detail: str | None, origin: Origin) -> bool:
        cur.execute(
            "INSERT INTO stage_results (request_id, stage, run_id, outcome, detail, member, topic, "
            "kafka_partition, kafka_offset) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (request_id, stage) DO NOTHING RETURNING 1",
            (event["request_id"], stage, event["run_id"], outcome, detail, origin.member,
             origin.topic, origin.partition, origin.offset))
        return cur.fetchone() is not None

    def mark_notified(self, request_id: str) -> None:
        with self._tx() as cur:
            cur.execute("UPDATE requests SET notified_at = coalesce(notified_at, now()) "
                        "WHERE request_id = %s", (request_id,))

    def claim(self, request_id: str, stage: str, owner: str, lease_s: float) -> Claim:
        """Claim (request, stage) before calling its AI, unless its result is already recorded.

        The claim is `owner`'s when nobody holds it, when `owner` holds it already, or when the
        holder's lease has expired (a member that died mid-call): then it is taken over.
        """
        with self._tx() as cur:
            cur.execute("SELECT coalesce(detail, outcome) FROM stage_results "
                        "WHERE request_id = %s AND stage = %s", (request_id, stage))
            row = cur.fetchone()
            if row is not None:
                return Claim(done=row[0])
            cur.execute(
                "INSERT INTO stage_claims (request_id, stage, owner, lease_until) "
                "VALUES (%(r)s, %(s)s, %(o)s, now() + make_interval(secs => %(l)s)) "
                "ON CONFLICT (request_id, stage) DO UPDATE SET owner = EXCLUDED.owner, "
                "lease_until = EXCLUDED.lease_until, "
                "takeovers = stage_claims.takeovers + (stage_claims.owner <> EXCLUDED.owner)::int "
                "WHERE stage_claims.owner = EXCLUDED.owner OR stage_claims.lease_until < now() "
                "RETURNING 1", {"r": request_id, "s": stage, "o": owner, "l": lease_s})
            return Claim(ours=cur.fetchone() is not None)

    def start_attempt(self, run_id: str, request_id: str, stage: str, origin: Origin, owner: str,
                      lease_s: float, attempt: int, started: float) -> int:
        """Renew the claim and write the attempt row before the try is sent; the row's id.

        Raises `ClaimLost` when the lease expired and another member took the claim over: the
        try is then not sent, and the record waits for that member's result.
        """
        with self._tx() as cur:
            cur.execute("UPDATE stage_claims SET lease_until = now() + make_interval(secs => %s) "
                        "WHERE request_id = %s AND stage = %s AND owner = %s RETURNING 1",
                        (lease_s, request_id, stage, owner))
            if cur.fetchone() is None:
                raise ClaimLost(f"{stage} claim of {request_id} taken over by another member")
            cur.execute(
                "INSERT INTO ai_attempts (run_id, request_id, stage, attempt, member, topic, "
                "kafka_partition, kafka_offset, started_at, outcome) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'started') RETURNING id",
                (run_id, request_id, stage, attempt, origin.member, origin.topic, origin.partition,
                 origin.offset, ts(started)))
            return cur.fetchone()[0]

    def end_attempts(self, ended: Sequence[tuple[int, float, str, int | None]]) -> None:
        """Complete attempt rows: (id, ended, outcome, http status)."""
        if not ended:
            return
        with self._tx() as cur:
            cur.executemany("UPDATE ai_attempts SET ended_at = %s, outcome = %s, http_status = %s "
                            "WHERE id = %s",
                            [(ts(at), outcome, status, row_id) for row_id, at, outcome, status in ended])

    def record_skip(self, run_id: str, request_id: str, stage: str, origin: Origin) -> None:
        """A re-consumed event whose result already exists: on record, and no AI call made."""
        now = ts(time.time())
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO ai_attempts (run_id, request_id, stage, attempt, member, topic, "
                "kafka_partition, kafka_offset, started_at, ended_at, outcome) "
                "VALUES (%s, %s, %s, 0, %s, %s, %s, %s, %s, %s, 'skipped_done')",
                (run_id, request_id, stage, origin.member, origin.topic, origin.partition,
                 origin.offset, now, now))

    def record_dead_letter(self, run_id: str, request_id: str | None, stage: str, reason: str,
                           origin: Origin, payload: bytes | None) -> None:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO dead_letters (run_id, request_id, stage, reason, source_topic, "
                "kafka_partition, kafka_offset, payload) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (source_topic, kafka_partition, kafka_offset) DO NOTHING",
                (run_id, request_id, stage, reason, origin.topic, origin.partition, origin.offset,
                 payload))
            if request_id:
                cur.execute("UPDATE requests SET status = 'dead_lettered' WHERE request_id = %s "
                            "AND status NOT IN ('completed', 'rejected')", (request_id,))

    def record_rebalance(self, run_id: str, group_id: str, member: str, event: str,
                         partitions: Sequence[str]) -> None:
        with self._tx() as cur:
            cur.execute("INSERT INTO rebalance_events (run_id, group_id, member, event, partitions) "
                        "VALUES (%s, %s, %s, %s, %s)",
                        (run_id, group_id, member, event, list(partitions)))

    def record_stats(self, run_id: str, member: str, stats: dict[str, Any]) -> None:
        with self._tx() as cur:
            cur.execute("INSERT INTO client_stats (run_id, member, stats) VALUES (%s, %s, %s)",
                        (run_id, member, json.dumps(stats)))
