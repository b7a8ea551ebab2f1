"""The batch tier's rows as its keeper reads and moves them (`batch_lines`, `ai_batches`; schema
in infra/migrations/0021_batch_tier.sql), over one connection of the keeper's own.

Every move is one statement or one transaction, guarded by the state it leaves: a line is
answered only while it is in its batch (`submitted`), falls back only while it is not answered,
and a batch is worked on only by the keeper whose lease it holds, so two keepers of a stage (two
processes of its fleet, or a restarted one beside the lease of the one it replaces) never
settle a line twice or submit a batch twice.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg2
from psycopg2.extensions import cursor

from consumers.ai.reply import Usage

ASSEMBLING, SUBMITTED, ENDED = "assembling", "submitted", "ended"


@dataclass(frozen=True)
class Scope:
    """Whose lines a keeper works on: one stage of one pipeline run."""

    pipeline: str
    run_id: str
    stage: str

    def params(self) -> dict[str, str]:
        return {"p": self.pipeline, "run": self.run_id, "s": self.stage}


@dataclass(frozen=True)
class OpenBatch:
    """A batch the keeper holds: taken over from another keeper when `taken_over`."""

    id: int
    state: str
    input_file_id: str | None
    provider_id: str | None
    taken_over: bool


@dataclass(frozen=True)
class Resend:
    """A settled line's event, to be sent to the stage again."""

    request_id: str
    event: dict[str, Any]


_SCOPE = "pipeline = %(p)s AND run_id = %(run)s AND stage = %(s)s"
_LEASE = "now() + make_interval(secs => %(lease)s)"


class BatchStore:
    """The keeper's reads and moves; safe to share between threads (one connection, locked)."""

    def __init__(self, database_url: str, scope: Scope, owner: str, lease_s: float) -> None:
        self._url, self.scope, self.owner, self.lease_s = database_url, scope, owner, lease_s
        self._conn: psycopg2.extensions.connection | None = None
        self._lock = threading.Lock()

    @contextmanager
    def _tx(self) -> Iterator[cursor]:
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg2.connect(self._url, connect_timeout=5,
                                              options="-c statement_timeout=10000")
            try:
                with self._conn, self._conn.cursor() as cur:
                    yield cur
            except psycopg2.Error:
                self._conn.close()
                raise

    def _params(self, **more: Any) -> dict[str, Any]:
        return {**self.scope.params(), "o": self.owner, "lease": self.lease_s, **more}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()

    def hold(self) -> list[OpenBatch]:
        """Renew the leases of this keeper's open batches and take over those whose keeper's
        lease ran out; every open batch it holds now."""
        with self._tx() as cur:
            cur.execute(
                f"WITH held AS (SELECT id, owner FROM ai_batches WHERE {_SCOPE} AND state <> 'ended' "
                "AND (owner = %(o)s OR lease_until < now()) FOR UPDATE) "
                f"UPDATE ai_batches b SET lease_until = {_LEASE}, owner = %(o)s FROM held "
                "WHERE b.id = held.id RETURNING b.id, b.state, b.input_file_id, b.provider_id, "
                "held.owner <> %(o)s", self._params())
            rows = cur.fetchall()
        return [OpenBatch(*row) for row in sorted(rows)]

    def assemble(self, max_lines: int, max_bytes: int, gather_s: float) -> int | None:
        """A new batch of the oldest pending lines (up to `max_lines` and `max_bytes` of
        requests), once there are `max_lines` of them or the oldest has waited `gather_s`; its
        id, None when there is none to make."""
        with self._tx() as cur:
            cur.execute(
                "SELECT request_id, octet_length(body::text), "
                "parked_at < now() - make_interval(secs => %(g)s) "
                f"FROM batch_lines WHERE {_SCOPE} AND state = 'pending' ORDER BY parked_at "
                "LIMIT %(n)s FOR UPDATE SKIP LOCKED", self._params(g=gather_s, n=max_lines))
            rows = cur.fetchall()
            if not rows or (len(rows) < max_lines and not rows[0][2]):
                return None
            taken: list[str] = []
            size = 0
            for request_id, length, _ in rows:
                if taken and size + length > max_bytes:
                    break
                taken.append(request_id)
                size += length
            cur.execute("INSERT INTO ai_batches (pipeline, run_id, stage, lines, owner, lease_until) "
                        f"VALUES (%(p)s, %(run)s, %(s)s, %(n)s, %(o)s, {_LEASE}) RETURNING id",
                        self._params(n=len(taken)))
            batch_id = cur.fetchone()[0]
            cur.execute(f"UPDATE batch_lines SET state = 'submitted', batch_id = %(b)s WHERE {_SCOPE} "
                        "AND request_id = ANY(%(ids)s)", self._params(b=batch_id, ids=taken))
        return batch_id

    def lines_of(self, batch_id: int) -> list[tuple[str, dict[str, Any]]]:
        """(request id, request body) of the batch's lines still waiting for it."""
        with self._tx() as cur:
            cur.execute("SELECT request_id, body FROM batch_lines WHERE batch_id = %(b)s "
                        "AND state = 'submitted' ORDER BY request_id", {"b": batch_id})
            return cur.fetchall()

    def uploaded(self, batch_id: int, input_file_id: str) -> None:
        with self._tx() as cur:
            cur.execute("UPDATE ai_batches SET input_file_id = %(f)s WHERE id = %(b)s AND owner = %(o)s",
                        self._params(f=input_file_id, b=batch_id))

    def submitted(self, batch_id: int, provider_id: str) -> None:
        with self._tx() as cur:
            cur.execute("UPDATE ai_batches SET provider_id = %(pid)s, state = 'submitted', "
                        "submitted_at = now() WHERE id = %(b)s AND owner = %(o)s",
                        self._params(pid=provider_id, b=batch_id))

    def ended(self, batch_id: int, outcome: str, answers: Mapping[str, Any] | None = None,
              failed: Mapping[str, str] | None = None, left: str | None = None) -> tuple[int, int]:
        """The batch's outcome in, in one transaction: each answered line (`answers`: request id
        -> the answer's body) answered unless it fell back meanwhile, each billed answer on
        record as a try of the batch tier, the lines `failed` (request id -> why) and those the
        batch left unanswered fallen back (`left` says why). (answered, answered too late: paid,
        not used)."""
        answers, failed = answers or {}, failed or {}
        with self._tx() as cur:
            cur.execute(
                "UPDATE batch_lines SET state = 'answered', answer = a.body, settled_at = now() "
                "FROM unnest(%(ids)s::text[], %(bodies)s::jsonb[]) AS a(request_id, body) "
                "WHERE batch_id = %(b)s AND batch_lines.request_id = a.request_id "
                "AND state = 'submitted' RETURNING batch_lines.request_id",
                {"b": batch_id, "ids": list(answers), "bodies": [json.dumps(b) for b in answers.values()]})
            answered = len(cur.fetchall())
            usage = [Usage.of(body, {}) for body in answers.values()]
            cur.execute(
                "INSERT INTO ai_attempts (pipeline, run_id, request_id, stage, attempt, member, topic, "
                "kafka_partition, kafka_offset, started_at, ended_at, outcome, http_status, redrive, "
                "tokens_input, tokens_output, tier) "
                "SELECT l.pipeline, l.run_id, l.request_id, l.stage, 1, %(o)s, l.topic, l.kafka_partition, "
                "l.kafka_offset, coalesce(b.submitted_at, l.parked_at), now(), 'ok', 200, l.redrive, "
                "a.tokens_input, a.tokens_output, 'batch' FROM batch_lines l JOIN unnest(%(ids)s::text[], "
                "%(ti)s::int[], %(to)s::int[]) AS a(request_id, tokens_input, tokens_output) "
                "ON l.request_id = a.request_id JOIN ai_batches b ON b.id = l.batch_id "
                "WHERE l.batch_id = %(b)s",
                self._params(b=batch_id, ids=list(answers),
                             ti=[u.tokens_input for u in usage], to=[u.tokens_output for u in usage]))
            cur.execute(
                "UPDATE batch_lines l SET state = 'fallen_back', settled_at = now(), "
                "why = coalesce(f.why, %(left)s) FROM (SELECT request_id FROM batch_lines "
                "WHERE batch_id = %(b)s AND state = 'submitted') w LEFT JOIN unnest(%(ids)s::text[], "
                "%(whys)s::text[]) AS f(request_id, why) ON f.request_id = w.request_id "
                "WHERE l.batch_id = %(b)s AND l.request_id = w.request_id",
                {"b": batch_id, "ids": list(failed), "whys": list(failed.values()),
                 "left": left or f"batch {outcome} without answering it"})
            cur.execute("UPDATE ai_batches SET state = 'ended', outcome = %(out)s, ended_at = now() "
                        "WHERE id = %(b)s", {"b": batch_id, "out": outcome})
        return answered, len(answers) - answered

    def fall_back_due(self) -> list[int]:
        """Fall back every line whose fallback time has come; the batches left with no line
        waiting for them (worth cancelling)."""
        with self._tx() as cur:
            cur.execute(
                "UPDATE batch_lines SET state = 'fallen_back', settled_at = now(), "
                "why = 'not answered by its fallback time' "
                f"WHERE {_SCOPE} AND state IN ('pending', 'submitted') AND fallback_at <= now() "
                "RETURNING batch_id", self._params())
            touched = sorted({row[0] for row in cur.fetchall() if row[0] is not None})
            if not touched:
                return []
            cur.execute("SELECT b.id FROM ai_batches b WHERE b.id = ANY(%(ids)s) AND b.state = 'submitted' "
                        "AND NOT EXISTS (SELECT FROM batch_lines l WHERE l.batch_id = b.id "
                        "AND l.state = 'submitted')", {"ids": touched})
            return [row[0] for row in cur.fetchall()]

    @contextmanager
    def resending(self, limit: int) -> Iterator[list[Resend]]:
        """The settled lines whose events are not sent back yet, locked for this keeper while
        the caller sends them; marked sent when the block ends without raising (a crash
        meanwhile leaves them to be sent again: a copy the stage takes as one)."""
        with self._tx() as cur:
            cur.execute(f"SELECT request_id, event FROM batch_lines WHERE {_SCOPE} "
                        "AND state IN ('answered', 'fallen_back') AND resent_at IS NULL "
                        "ORDER BY settled_at LIMIT %(n)s FOR UPDATE SKIP LOCKED", self._params(n=limit))
            found = [Resend(*row) for row in cur.fetchall()]
            yield found
            if found:
                cur.execute(f"UPDATE batch_lines SET resent_at = now() WHERE {_SCOPE} "
                            "AND request_id = ANY(%(ids)s)", self._params(ids=[r.request_id for r in found]))

    def turnarounds(self, recent: int) -> list[float]:
        """The seconds the stage's last `recent` completed batches of the run took, oldest first
        (a run's own: another run may have had another time scale)."""
        with self._tx() as cur:
            cur.execute("SELECT extract(epoch FROM ended_at - submitted_at)::float8 FROM ai_batches "
                        f"WHERE {_SCOPE} AND outcome = 'completed' "
                        "ORDER BY ended_at DESC LIMIT %(n)s", self._params(n=recent))
            return [row[0] for row in reversed(cur.fetchall())]

    def release(self) -> None:
        """This keeper stops: its batches' leases end now, for another keeper to take over."""
        with self._tx() as cur:
            cur.execute(f"UPDATE ai_batches SET lease_until = now() WHERE {_SCOPE} AND owner = %(o)s "
                        "AND state <> 'ended'", self._params())

