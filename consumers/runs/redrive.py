"""Send dead letters back to their source topic, each at most once, and keep a record of each.

    python -m consumers.runs.redrive --pipeline genai_image --run run-3f2a --reason ai_unavailable
    python -m consumers.runs.redrive --pipeline text_moderation --stage summarize --since 2026-03-01T10:00Z \\
        --limit 50 --rate 5 --by alice

A redrive selects a pipeline's dead letters (by run id or run-id prefix, stages, reasons, a time
range on `dead_letters.at`, at most `limit`, oldest first) and considers each in turn:

- `skipped_done`: the request has a result for that stage (`stage_results`): nothing to redo;
- `skipped_limit`: the letter's round (`dead_letters.redrive`) is at `max_redrives` already;
- `skipped_reference`: its stored value is a prefix (`dead_letter.STORED_PAYLOAD_BYTES`, as for
  every record dead-lettered by reference) or missing, so it cannot go back as it came;
- `redriven`: its value and key go back to its source topic with the headers `redrive_count`
  (its round plus one: the runtime starts a fresh try budget for it) and `dead_letter_id`, at
  `rate` records per second, each delivery acknowledged before the next.

Each consideration is a `redrives` row (who asked, which batch, when, outcome, round). A letter
considered for good (sent, skipped as done or by reference, or skipped at the same limit) is not
selected again, so repeating a redrive does nothing, and a raised limit lets held letters through.
The runtime keeps the claims that make a redriven record cost no duplicate AI call: a stage with
a result sends the result on without calling, and a request's tries are counted per round.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg2
from psycopg2.extensions import connection

from consumers.config import kafka_connection, pipeline_spec
from consumers.config.kafka_connection import KafkaConnection
from consumers.config.pipeline_spec import PipelineSpec
from consumers.kafka_clients.producer import KeyedProducer
from consumers.kafka_clients.records import Header
from consumers.runtime import dead_letter

REDRIVEN = "redriven"
SKIPPED_DONE = "skipped_done"
SKIPPED_LIMIT = "skipped_limit"
SKIPPED_REFERENCE = "skipped_reference"
OUTCOMES = (REDRIVEN, SKIPPED_DONE, SKIPPED_LIMIT, SKIPPED_REFERENCE)
# The request status between a redrive and the stage taking the record back: the lowest rank a
# status has (`consumers.runtime.stages`), so whichever stage handles it moves the status forward again,
# while a stage with no status of its own (rank -1, `consumers.runtime.storage`) leaves it be.
REDRIVEN_STATUS = "redriven"
REDRIVEN_RANK = 0
DELIVERY_TIMEOUT_S = 30.0

# A letter is done with when it went back (its delivery confirmed), when its request had the
# stage's result or its value was not whole, or when it was held at the limit it is held at now.
_CONSIDERED_FOR_GOOD = (
    "EXISTS (SELECT FROM redrives x WHERE x.dead_letter_id = d.id AND ("
    "(x.outcome = 'redriven' AND x.sent_at IS NOT NULL) "
    "OR x.outcome IN ('skipped_done', 'skipped_reference') "
    "OR (x.outcome = 'skipped_limit' AND d.redrive >= %(max_redrives)s)))")

_SELECT = (
    "SELECT d.id FROM dead_letters d WHERE d.pipeline = %(pipeline)s AND starts_with(d.run_id, %(run)s) "
    "AND (cardinality(%(stages)s::text[]) = 0 OR d.stage = ANY(%(stages)s)) "
    "AND (cardinality(%(reasons)s::text[]) = 0 OR split_part(d.reason, ':', 1) = ANY(%(reasons)s)) "
    "AND d.at >= coalesce(%(since)s, '-infinity'::timestamptz) "
    "AND d.at < coalesce(%(until)s, 'infinity'::timestamptz) "
    f"AND NOT {_CONSIDERED_FOR_GOOD} ORDER BY d.id LIMIT %(limit)s")

# One letter, locked so that two redrives consider it one after the other; `pending` is the row
# of a redrive that committed but whose delivery was never confirmed (a crash between the two).
_LETTER = (
    "SELECT d.request_id, d.stage, d.source_topic, d.kafka_key, d.payload, d.redrive, "
    "EXISTS (SELECT FROM stage_results r WHERE r.pipeline = d.pipeline AND r.request_id = d.request_id "
    "AND r.stage = d.stage), "
    "(SELECT x.id FROM redrives x WHERE x.dead_letter_id = d.id AND x.outcome = 'redriven' "
    f"AND x.sent_at IS NULL), {_CONSIDERED_FOR_GOOD} "
    "FROM dead_letters d WHERE d.id = %(id)s FOR UPDATE OF d")

_RECORD = ("INSERT INTO redrives (dead_letter_id, batch, requested_by, outcome, round) "
           "VALUES (%s, %s, %s, %s, %s) RETURNING id")

# What the dead letter did to its request, undone so the stage can complete it: an entry stage's
# count of it (the record counts again when handled), and the settled status, unless another
# dead letter of the request still stands (no result for its stage, not redriven): the request
# stays dead-lettered by that one. `finished_at` goes with the status: a stage that completed
# while the status stayed dead-lettered (held by such another letter) has set it.
_UNSETTLE = (
    "WITH held AS (SELECT EXISTS (SELECT FROM dead_letters o WHERE o.pipeline = %(p)s "
    "AND o.request_id = %(r)s AND o.id <> %(id)s "
    "AND NOT EXISTS (SELECT FROM stage_results s WHERE s.pipeline = o.pipeline "
    "AND s.request_id = o.request_id AND s.stage = o.stage) "
    "AND NOT EXISTS (SELECT FROM redrives x WHERE x.dead_letter_id = o.id AND x.outcome = 'redriven')"
    ") AS other), "
    "unsettled AS (SELECT q.status IN ('dead_lettered', %(status)s) AND NOT held.other AS yes "
    "FROM requests q, held WHERE q.pipeline = %(p)s AND q.request_id = %(r)s) "
    "UPDATE requests q SET entries = q.entries - %(entry)s, "
    "status = CASE WHEN u.yes THEN %(status)s ELSE q.status END, "
    "status_rank = CASE WHEN u.yes THEN %(rank)s ELSE q.status_rank END, "
    "finished_at = CASE WHEN u.yes THEN NULL ELSE q.finished_at END "
    "FROM unsettled u WHERE q.pipeline = %(p)s AND q.request_id = %(r)s")

_CONFIRM = "UPDATE redrives SET sent_partition = %s, sent_offset = %s, sent_at = now() WHERE id = %s"


@dataclass(frozen=True)
class Selection:
    """Which dead letters of a pipeline a redrive considers, and the limit it holds them to."""

    pipeline: str
    run: str = ""  # a run id or a prefix of run ids; "" for any
    stages: tuple[str, ...] = ()  # () for any
    reasons: tuple[str, ...] = ()  # reason codes (`ai_unavailable`, ...); () for any
    since: datetime | None = None  # dead_letters.at >= since
    until: datetime | None = None  # dead_letters.at < until
    limit: int = 100
    max_redrives: int = 3

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"limit must be at least 1, got {self.limit}")
        if self.max_redrives < 0:
            raise ValueError(f"max_redrives must not be negative, got {self.max_redrives}")
        if self.since and self.until and self.since >= self.until:
            raise ValueError(f"since ({self.since}) must be before until ({self.until})")

    def check(self, spec: PipelineSpec) -> None:
        """Refuse stages the pipeline does not have: a typo would select nothing, silently."""
        unknown = sorted(set(self.stages) - set(spec.stage_names))
        if unknown:
            raise ValueError(f"{spec.name} has no stage {', '.join(unknown)}; "
                             f"its stages: {', '.join(spec.stage_names)}")

    def params(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "run": self.run, "stages": list(self.stages),
                "reasons": list(self.reasons), "since": self.since, "until": self.until,
                "limit": self.limit, "max_redrives": self.max_redrives}


@dataclass(frozen=True)
class Letter:
    """A dead letter as a redrive sees it, read under its lock."""

    id: int
    request_id: str | None
    stage: str
    source_topic: str
    key: bytes | None
    payload: bytes | None
    redrive: int  # the round the record was in when it was dead-lettered
    done: bool  # its request has a result for its stage

    @property
    def round(self) -> int:
        """The round it goes back in: its `redrive_count` header."""
        return self.redrive + 1

    @property
    def whole(self) -> bool:
        """Its stored value is the record's own: not a prefix of a longer one, and not missing
        (a record without a value, which the producer cannot send and no stage could read)."""
        return self.payload is not None and len(self.payload) < dead_letter.STORED_PAYLOAD_BYTES

    def headers(self) -> list[Header]:
        return [(dead_letter.REDRIVE_COUNT_HEADER, str(self.round).encode()),
                (dead_letter.DEAD_LETTER_ID_HEADER, str(self.id).encode())]


def outcome(letter: Letter, max_redrives: int) -> str:
    """What a redrive does with a letter (see the module docstring); a result since beats the
    limit, which beats a value that is not whole, so a skip names the first reason that holds."""
    if letter.done:
        return SKIPPED_DONE
    if letter.redrive >= max_redrives:
        return SKIPPED_LIMIT
    if not letter.whole:
        return SKIPPED_REFERENCE
    return REDRIVEN


class Pacer:
    """At most `rate` sends a second: each waits until `1 / rate` seconds after the one before,
    and one that comes late is not made up for by a burst (the clock and the sleep are
    injectable for tests)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self._interval, self._clock, self._sleep = 1.0 / rate, clock, sleep
        self._next = float("-inf")

    def wait(self) -> None:
        now = self._clock()
        if self._next > now:
            self._sleep(self._next - now)
        self._next = max(self._next, now) + self._interval


@dataclass(frozen=True)
class _Considered:
    """A letter's consideration, committed: its outcome and, when it goes back, its row."""

    letter: Letter
    outcome: str
    row: int | None


def _consider(conn: connection, letter_id: int, selection: Selection, spec: PipelineSpec,
              batch: str, requested_by: str) -> _Considered | None:
    """Decide on one letter and record it, with what a redrive undoes of the dead letter, in one
    transaction; None when another redrive considered it for good meanwhile."""
    with conn, conn.cursor() as cur:
        cur.execute(_LETTER, {"id": letter_id, "max_redrives": selection.max_redrives})
        request_id, stage, topic, key, payload, redrive, done, pending, finished = cur.fetchone()
        letter = Letter(letter_id, request_id, stage, topic, None if key is None else bytes(key),
                        None if payload is None else bytes(payload), redrive, done)
        if finished:
            return None
        if pending is not None:  # its redrive was recorded, its delivery never confirmed
            return _Considered(letter, REDRIVEN, pending)
        decided = outcome(letter, selection.max_redrives)
        cur.execute(_RECORD, (letter_id, batch, requested_by, decided, letter.round))
        row = cur.fetchone()[0]
        if decided == REDRIVEN and request_id is not None:
            cur.execute(_UNSETTLE, {"p": spec.name, "r": request_id, "id": letter_id,
                                    "entry": int(stage in spec.entry_stages),
                                    "status": REDRIVEN_STATUS, "rank": REDRIVEN_RANK})
        return _Considered(letter, decided, row)


def _send(conn: connection, producer: KeyedProducer, considered: _Considered) -> bool:
    """Send the letter back and confirm its delivery on its row; False when another redrive is
    sending it or has. The row stays locked while the record is out, so two redrives never both
    send it; a delivery that fails leaves the row unconfirmed, for the next redrive to send."""
    letter = considered.letter
    with conn, conn.cursor() as cur:
        cur.execute("SELECT FROM redrives WHERE id = %s AND sent_at IS NULL FOR UPDATE SKIP LOCKED",
                    (considered.row,))
        if cur.fetchone() is None:
            return False
        partition, offset = producer.send(letter.source_topic, value=letter.payload, key=letter.key,
                                          headers=letter.headers()).result(DELIVERY_TIMEOUT_S)
        cur.execute(_CONFIRM, (partition, offset, considered.row))
    return True


def _selected(conn: connection, selection: Selection) -> list[int]:
    with conn, conn.cursor() as cur:
        cur.execute(_SELECT, selection.params())
        return [row[0] for row in cur.fetchall()]


def redrive(selection: Selection, kafka: KafkaConnection, database_url: str, requested_by: str,
            rate: float = 20.0, batch: str | None = None,
            pacer: Pacer | None = None) -> dict[str, Any]:
    """Redrive the selected dead letters; the summary: `selected` (considered) and a count per
    outcome, with the batch its `redrives` rows carry.

    Each letter's decision and what it undoes of the dead letter are committed before its record
    is sent, and its delivery is confirmed on its row after. A crash before the commit leaves the
    letter as it was; one after it leaves the row unconfirmed, and the next redrive of the same
    selection sends the record (again, if the first copy went out): a redrive is never lost,
    and a record sent twice meets the claims (the stage's result, the request's tries in its
    round), which keep the second copy from calling the AI again. Sending first and recording
    after would lose the record of a redrive that happened, leaving its request settled as
    dead-lettered while its stage completes.
    """
    spec = pipeline_spec.load(selection.pipeline)
    selection.check(spec)
    batch = batch or f"redrive-{uuid.uuid4().hex[:10]}"
    pacer = pacer or Pacer(rate)
    counts: Counter[str] = Counter()
    producer = KeyedProducer(kafka, profile="durability", key_strategy="none")
    try:
        with contextlib.closing(psycopg2.connect(database_url)) as conn:
            for letter_id in _selected(conn, selection):
                considered = _consider(conn, letter_id, selection, spec, batch, requested_by)
                if considered is None:
                    continue
                counts["selected"] += 1
                if considered.outcome != REDRIVEN:
                    counts[considered.outcome] += 1
                    continue
                pacer.wait()
                counts[REDRIVEN] += _send(conn, producer, considered)
    finally:
        producer.close()
    return {"batch": batch, "requested_by": requested_by, "selected": counts["selected"],
            **{name: counts[name] for name in OUTCOMES}}


def timestamp(text: str) -> datetime | None:
    """An ISO-8601 timestamp ("" for none); one without an offset is taken as UTC."""
    if not text:
        return None
    at = datetime.fromisoformat(text)
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m consumers.runs.redrive", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeline", required=True, help="the pipeline whose dead letters go back")
    p.add_argument("--run", default="", help="a run id, or a prefix of run ids (default: any)")
    p.add_argument("--stage", action="append", default=[], help="a stage (repeat for several; default: any)")
    p.add_argument("--reason", action="append", default=[],
                   help="a reason code such as ai_unavailable (repeat for several; default: any)")
    p.add_argument("--since", default="", help="dead-lettered at or after this ISO-8601 time")
    p.add_argument("--until", default="", help="dead-lettered before this ISO-8601 time")
    p.add_argument("--limit", type=int, default=100, help="at most this many dead letters, oldest first")
    p.add_argument("--rate", type=float, default=20.0, help="records sent per second")
    p.add_argument("--max-redrives", type=int, default=3,
                   help="a record is not sent back more often than this")
    p.add_argument("--by", default=None, help="who asks, kept with each redrive (default: the OS user)")
    kafka_connection.add_argument(p)
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    return p


def selection_from_args(args: argparse.Namespace) -> Selection:
    """The selection a command line asks for (raises ValueError on a bad time or bound)."""
    return Selection(args.pipeline, args.run, tuple(args.stage), tuple(args.reason),
                     timestamp(args.since), timestamp(args.until), args.limit, args.max_redrives)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the summary as JSON."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error("set --database-url or DATABASE_URL (or source .local/stack.env)")
    try:
        selection = selection_from_args(args)
        selection.check(pipeline_spec.load(selection.pipeline))
    except ValueError as exc:  # SpecError is one
        parser.error(str(exc))
    kafka = kafka_connection.from_args(args, parser).default
    summary = redrive(selection, kafka, args.database_url, args.by or getpass.getuser(), args.rate)
    json.dump(summary, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
