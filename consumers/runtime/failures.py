"""Poison or transient: whose fault is a failure to handle one record.

Only a failure that is the record's own fault is dead-lettered: an invalid event, a data
error the database refuses, an AI request the service answers with a final error, or keeps
failing after the configured tries while the endpoint serves others (`ai_unavailable`), a 2xx
answer the stage cannot use (`ai_bad_answer`), an exception the team's own work raised on it
after the stage's tries (`work_failed`), a downstream event too large to send. A failure of a
dependency (PostgreSQL unreachable, a Kafka delivery that timed out, an AI endpoint refusing
everyone with 429, not answering connections or down for every caller, an exception the work
declares as a dependency's, another member holding the record's claim) says nothing about the
record: it is retried with backoff while the partition waits, and the offset is never committed
past it. A fatal client error (librdkafka's idempotent producer after,
say, a refused producer id) leaves the member's producer unusable: no retry can succeed in this
process. That, and anything else the member cannot judge, is neither dead-lettered nor
committed, and the member goes down loudly so its supervisor restarts it.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass

import psycopg2
import psycopg2.pool
from confluent_kafka import KafkaError, KafkaException

from consumers.ai.client import AIBadAnswer, AIUnavailable, AIWaiting
from consumers.config.events import InvalidEvent
from consumers.kafka_clients.producer import DeliveryError

POISON = "poison"
TRANSIENT = "transient"
FATAL = "fatal"

# Delivery errors that are the produced record's fault: retrying cannot help.
_RECORD_DELIVERY_ERRORS = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG_SIZE, KafkaError.RECORD_LIST_TOO_LARGE,
})


class Transient(RuntimeError):
    """A dependency failed; the same record may well succeed later."""


class ClaimHeld(Transient):
    """Another member holds the (request, stage) claim: wait for its result or its lease."""


class WorkFailed(RuntimeError):
    """The team's own work raised on this record, after the stage's tries."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
        self.reason = str(self)


@dataclass(frozen=True)
class Verdict:
    """How a failure is handled, and the reason code a dead letter carries."""

    kind: str  # poison | transient | fatal
    reason: str


def classify(exc: BaseException) -> Verdict:
    """Whose fault `exc` is; see the module docstring."""
    if isinstance(exc, InvalidEvent):
        return Verdict(POISON, exc.reason)
    if isinstance(exc, AIUnavailable):
        return Verdict(POISON, "ai_unavailable")
    if isinstance(exc, AIBadAnswer):
        return Verdict(POISON, "ai_bad_answer")
    if isinstance(exc, WorkFailed):
        return Verdict(POISON, "work_failed")
    if isinstance(exc, Transient | AIWaiting):
        return Verdict(TRANSIENT, type(exc).__name__)
    if isinstance(exc, psycopg2.DataError | psycopg2.IntegrityError):
        return Verdict(POISON, "database_rejected")
    if isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError | psycopg2.pool.PoolError):
        return Verdict(TRANSIENT, "database_unavailable")
    if isinstance(exc, DeliveryError | KafkaException):
        error = exc.error if isinstance(exc, DeliveryError) else exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.fatal():
            return Verdict(FATAL, "kafka_client_fatal")
        code = error.code() if isinstance(error, KafkaError) else None
        return Verdict(POISON if code in _RECORD_DELIVERY_ERRORS else TRANSIENT, "delivery_failed")
    if isinstance(exc, BufferError | concurrent.futures.TimeoutError | TimeoutError):
        return Verdict(TRANSIENT, "kafka_unavailable")
    return Verdict(FATAL, "processing_error")
