"""The run records' connection pool and writes (`Storage`), and pools sized to what the server
has free."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from typing import Any

import psycopg2
from psycopg2.extensions import connection
from psycopg2.pool import ThreadedConnectionPool

from consumers.config.pipeline_spec import TERMINAL_STATUSES
from consumers.runtime.storage.records import (
    CallClaim,
    Claim,
    ClaimLost,
    Ended,
    Key,
    Line,
    Origin,
    Parked,
    Status,
    ts,
)
from consumers.runtime.storage.statements import (
    DEAD_LETTERED_RANK,
    END_ATTEMPTS,
    FORWARD,
    PARK,
    START_ATTEMPT,
    TAKE,
    TAKE_AND_CLAIM,
    ended_params,
    row_params,
)

log = logging.getLogger(__name__)

LEFT_FOR_OTHERS = 16  # connections a new pool leaves free: the platform's other processes need some

_FREE_CONNECTIONS = (
    "SELECT current_setting('max_connections')::int "
    "- current_setting('superuser_reserved_connections')::int "
    "- coalesce(current_setting('reserved_connections', true)::int, 0) "
    "- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')")


def free_connections(database_url: str) -> int:
    """Client connections the server would still accept from an ordinary role (its
    max_connections less the reserved slots and the client connections open now, this one
    included)."""
    with closing(psycopg2.connect(database_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(_FREE_CONNECTIONS)
        return cur.fetchone()[0]


def fitted_pool_size(wanted: int, free: int) -> int:
    """`wanted`, or what the server has free beyond LEFT_FOR_OTHERS when that is less; never
    under one, so that a full server refuses the pool loudly rather than getting an empty one."""
    return max(1, min(wanted, free - LEFT_FOR_OTHERS))


def sized_pool(database_url: str, wanted: int) -> Storage:
    """A Storage of `wanted` connections, fewer (with a warning) when the server has not the
    room: several fleets share one server, and a pool that cannot open fails its fleet."""
    size = fitted_pool_size(wanted, free_connections(database_url))
    if size < wanted:
        log.warning("database pool of %d connections instead of %d: the server has no more free "
                    "beyond the %d left for others (raise its max_connections)", size, wanted,
                    LEFT_FOR_OTHERS)
    return Storage(database_url, pool_size=size)


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
    def _tx(self, atomic: bool = True) -> Iterator[Any]:
        """One transaction; with `atomic=False`, statements that each commit on their own, for
        writes that need nothing undone with them: that spares the BEGIN and COMMIT round trips,
        two of a single statement's three. A connection that failed is closed rather than
        handed back: after a server restart it is dead, and the pool leaks its slot if rolling
        it back raises."""
        with self._free:
            conn: connection = self._pool.getconn()
            conn.autocommit = not atomic
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

    def record_members(self, run_id: str, stage: str, version: int | None, canary: int | None,
                       members: list[str]) -> None:
        """Which version each member runs, and for which canary if any, so every row it writes
        says which version handled it."""
        with self._tx() as cur:
            cur.executemany("INSERT INTO fleet_members (run_id, member, stage, version, canary) "
                            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id, member) DO UPDATE SET "
                            "version = excluded.version, canary = excluded.canary, started_at = now()",
                            [(run_id, m, stage, version, canary) for m in members])

    def finish_run(self, run_id: str) -> None:
        with self._tx() as cur:
            cur.execute("UPDATE runs SET finished_at = now() WHERE run_id = %s", (run_id,))

    def take(self, key: Key, produced_at: float, fields: dict[str, Any], status: Status | None,
             call: CallClaim | None = None) -> tuple[dict, Claim | None]:
        """A stage takes the request: create its row or merge `fields` into it (whichever event
        arrives first), move its status forward; return every field the row holds now.

        With `call`, the same statement claims the stage's AI call (see `TAKE_AND_CLAIM`) and
        the claim comes back too, None while the join waits: one round trip instead of the three
        of taking, claiming and writing the first try's row.
        """
        params = {"p": key.pipeline, "r": key.request_id, "run": key.run_id, "at": ts(produced_at),
                  "fields": json.dumps(fields), "status": status.name if status else None,
                  "rank": status.rank if status else -1, "settled": list(TERMINAL_STATUSES)}
        with self._tx(atomic=False) as cur:
            if call is None:
                cur.execute(TAKE, params)
                return cur.fetchone()[0], None
            cur.execute(TAKE_AND_CLAIM, {
                **params, **row_params(key, call.stage, call.origin), "o": call.owner, "l": call.lease_s,
                "join": list(call.join), "sent": ts(time.time())})
            row, done, first, own = cur.fetchone()
        if any(name not in row for name in call.join):
            return row, None
        return row, Claim(done=done, first_attempt=first, own_failures=own)

    def record_result(self, key: Key, stage: str, result: dict[str, Any] | None, origin: Origin,
                      status: Status | None, entry: bool, ended: Sequence[Ended] = ()) -> bool:
        """A stage's result, once, with what it does to the request row (the kept fields, the
        status, an entry stage's count) and the endings of the tries that got it (`ended`, see
        `end_attempts`), in one statement (atomic as a transaction, one round trip instead of
        five). True when this record holds the result: recorded now, or by an earlier handling
        of the same record (topic, partition, offset) that ended before sending its outputs, so
        a route sent `once` goes out with the handling that completes that record; False for
        another record of the same request."""
        with self._tx(atomic=False) as cur:
            cur.execute(
                f"WITH ended AS ({END_ATTEMPTS}), "
                "first AS (INSERT INTO stage_results (pipeline, request_id, stage, run_id, outcome, "
                "result, member, topic, kafka_partition, kafka_offset) VALUES (%(p)s, %(r)s, %(s)s, "
                "%(run)s, 'ok', %(result)s, %(member)s, %(topic)s, %(partition)s, %(offset)s) "
                "ON CONFLICT (pipeline, request_id, stage) DO NOTHING RETURNING 1), "
                "forward AS (UPDATE requests SET fields = fields || %(fields)s, "
                "entries = entries + %(entry)s, "
                "finished_at = CASE WHEN %(settles)s AND NOT requests.status = ANY(%(settled)s) "
                f"THEN now() ELSE finished_at END, {FORWARD} "
                "WHERE pipeline = %(p)s AND request_id = %(r)s AND EXISTS (SELECT FROM first)) "
                "SELECT EXISTS (SELECT FROM first) OR EXISTS (SELECT FROM stage_results WHERE "
                "pipeline = %(p)s AND request_id = %(r)s AND stage = %(s)s AND topic = %(topic)s "
                "AND kafka_partition = %(partition)s AND kafka_offset = %(offset)s)",
                {**row_params(key, stage, origin), "result": None if result is None else json.dumps(result),
                 "fields": json.dumps(result or {}), "entry": int(entry),
                 "settles": bool(status and status.settles),
                 # no status: rank -1 is below every row's, so the row keeps its own
                 "status": status.name if status else "", "rank": status.rank if status else -1,
                 "settled": list(TERMINAL_STATUSES), **ended_params(ended)})
            return cur.fetchone()[0]

    def park(self, key: Key, stage: str, origin: Origin, parked: Parked | None) -> Line | None:
        """Park the record for the batch tier (`parked`; None: look only), unless the stage's
        result is recorded or the request has a line at the stage: its line as it is now, None
        when it has none (see `PARK`)."""
        params = {**row_params(key, stage, origin), "park": parked is not None,
                  "event": json.dumps(parked.event) if parked else None,
                  "body": json.dumps(parked.body) if parked else None,
                  "deadline": ts(parked.deadline_at) if parked else None,
                  "fallback": ts(parked.fallback_at) if parked else None}
        with self._tx(atomic=False) as cur:
            cur.execute(PARK, params)
            found = cur.fetchone()
        return Line(*found) if found else None

    def mark_notified(self, *keys: Key) -> None:
        """The settling routes' messages were acknowledged (or their transaction committed):
        the end of the requests' latency."""
        if not keys:
            return
        with self._tx(atomic=False) as cur:
            cur.execute("UPDATE requests r SET notified_at = coalesce(r.notified_at, now()) "
                        "FROM unnest(%s::text[], %s::text[]) AS k(pipeline, request_id) "
                        "WHERE r.pipeline = k.pipeline AND r.request_id = k.request_id",
                        ([k.pipeline for k in keys], [k.request_id for k in keys]))

    def start_attempt(self, key: Key, stage: str, origin: Origin, owner: str, lease_s: float,
                      attempt: int, started: float, row: int | None = None) -> int:
        """Renew the claim and put the try on record as sent, right before it is sent: the first
        try's `row` (written QUEUED with the claim) becomes 'started', a later try gets a row of
        its own. The row's id.

        Raises `ClaimLost` when the lease expired and another member took the claim over: the
        try is then not sent, and the record waits for that member's result.
        """
        renew = ("WITH renewed AS (UPDATE stage_claims "
                 "SET lease_until = now() + make_interval(secs => %(l)s) WHERE pipeline = %(p)s "
                 "AND request_id = %(r)s AND stage = %(s)s AND owner = %(o)s RETURNING 1) ")
        write = ("UPDATE ai_attempts SET outcome = 'started', started_at = %(sent)s WHERE id = %(id)s "
                 "AND EXISTS (SELECT FROM renewed) RETURNING id" if row is not None
                 else START_ATTEMPT.format(attempt="%(attempt)s", ended="NULL", outcome="started",
                                            source="renewed"))
        with self._tx(atomic=False) as cur:
            cur.execute(renew + write, {**row_params(key, stage, origin), "l": lease_s, "o": owner,
                                        "attempt": attempt, "sent": ts(started), "id": row})
            found = cur.fetchone()
            if found is None:
                raise ClaimLost(f"{stage} claim of {key.request_id} taken over by another member")
            return found[0]

    def end_attempts(self, ended: Sequence[Ended]) -> None:
        """Complete the attempt rows of tries that got no result (a result completes its own
        with `record_result`)."""
        if ended:
            with self._tx(atomic=False) as cur:
                cur.execute(END_ATTEMPTS, ended_params(ended))

    def record_dead_letter(self, pipeline: str, run_id: str, key: Key | None, stage: str, reason: str,
                           origin: Origin, payload: bytes | None, entry: bool = False,
                           kafka_key: bytes | None = None) -> None:
        """A dead-lettered record, once per (pipeline, run, source offset): a topic recreated
        under its name starts its offsets again. When its key is known, the request is settled
        as dead-lettered (unless it already completed or was rejected) and, at an entry stage,
        counted as taken, since no other record of that stage will come for it."""
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO dead_letters (pipeline, run_id, request_id, stage, reason, source_topic, "
                "kafka_partition, kafka_offset, payload, kafka_key, redrive) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (pipeline, run_id, source_topic, kafka_partition, kafka_offset) "
                "DO NOTHING RETURNING 1",
                (pipeline, run_id, key.request_id if key else None, stage, reason, origin.topic,
                 origin.partition, origin.offset, payload, kafka_key, origin.redrive))
            if key is not None and cur.fetchone() is not None:
                cur.execute(
                    "INSERT INTO requests (pipeline, request_id, run_id, status, status_rank, entries) "
                    "VALUES (%(p)s, %(r)s, %(run)s, 'dead_lettered', %(rank)s, %(entry)s) "
                    "ON CONFLICT (pipeline, request_id) DO UPDATE SET "
                    f"entries = requests.entries + %(entry)s, {FORWARD}",
                    {"p": key.pipeline, "r": key.request_id, "run": key.run_id, "status": "dead_lettered",
                     "rank": DEAD_LETTERED_RANK, "entry": int(entry), "settled": list(TERMINAL_STATUSES)})

    def record_rebalance(self, run_id: str, group_id: str, member: str, event: str,
                         partitions: Sequence[str]) -> None:
        with self._tx() as cur:
            cur.execute("INSERT INTO rebalance_events (run_id, group_id, member, event, partitions) "
                        "VALUES (%s, %s, %s, %s, %s)",
                        (run_id, group_id, member, event, list(partitions)))

    def record_circuit(self, run_id: str, stage: str, endpoint: str,
                       changes: Sequence[tuple[float, str, str]]) -> None:
        """An endpoint circuit's transitions: (epoch seconds, state, detail)."""
        with self._tx() as cur:
            cur.executemany("INSERT INTO endpoint_circuits (run_id, stage, endpoint, at, state, detail) "
                            "VALUES (%s, %s, %s, %s, %s, %s)",
                            [(run_id, stage, endpoint, ts(at), state, detail[:500])
                             for at, state, detail in changes])

    def record_limits(self, run_id: str, stage: str, changes: Sequence[tuple[float, float, int]]) -> None:
        """An adaptive limiter's changes: (epoch seconds, limit, calls in flight)."""
        with self._tx() as cur:
            cur.executemany("INSERT INTO ai_limits (run_id, stage, at, limit_value, in_flight) "
                            "VALUES (%s, %s, %s, %s, %s)",
                            [(run_id, stage, ts(at), int(limit), in_flight)
                             for at, limit, in_flight in changes])

    def record_budgets(self, run_id: str, stage: str,
                       changes: Sequence[tuple[float, str, float, bool]]) -> None:
        """A rate budget's changes: (epoch seconds, kind, budget per minute, a turn learned)."""
        with self._tx() as cur:
            cur.executemany("INSERT INTO ai_budgets (run_id, stage, at, kind, per_minute, turned) "
                            "VALUES (%s, %s, %s, %s, %s, %s)",
                            [(run_id, stage, ts(at), kind, per_minute, turned)
                             for at, kind, per_minute, turned in changes])

    def record_stats(self, run_id: str, member: str, stats: dict[str, Any]) -> None:
        with self._tx() as cur:
            cur.execute("INSERT INTO client_stats (run_id, member, stats) VALUES (%s, %s, %s)",
                        (run_id, member, json.dumps(stats)))
