"""Where a stage's outputs go: straight to Kafka, or into the member's next transaction.

A record's outputs (its routes' events, its dead letter and failure notice) are handed over
once its handling is done, all at once, with the key of the request they settle, if any.

`DirectOutbox` (at least once) sends them through the fleet's shared producer and waits for
every acknowledgement; a member that dies between the sends and its offset commit sends them
again when the record is consumed again, so a reader may see an output twice.

`TransactionalOutbox` (exactly once for a `read_committed` reader, KIP-98 and KIP-447) keeps
them until the member commits the input offsets they answer, then produces them and commits
those offsets in one transaction of the member's own producer, with the consumer group's
metadata, so a member fenced by a rebalance cannot commit. Only the outputs of records below the
committed positions go in: a record completed past a position (one below it still in flight)
waits, so outputs never run ahead of offsets, and a record handled again after a crash or a
rebalance sends its outputs in the transaction that commits it, never in one that did not.
A record's hand-over replaces what an earlier try of the same record handed over: one record,
one set of outputs. A transaction whose end the producer cannot report (a cluster that stopped
answering) is settled by a new producer of the same id and the offsets the group committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from consumers.config import profiles
from consumers.config.kafka_connection import KafkaConnection
from consumers.kafka_clients.producer import KeyedProducer
from consumers.kafka_clients.records import Header
from consumers.runtime import failures
from consumers.runtime.storage import Key, Origin

log = logging.getLogger(__name__)

DELIVERY_TIMEOUT_S = 30.0
# Errors that say the cluster did not answer in time (the client's and the broker's)
TIMEOUTS = frozenset({KafkaError._TIMED_OUT, KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT})
Position = tuple[str, int]


@dataclass(frozen=True)
class Outgoing:
    """One record to produce, ready to send (topic name, bytes, key, headers)."""

    topic: str
    value: bytes
    key: bytes | None = None
    headers: list[Header] | None = None


class Outbox(Protocol):
    def deliver(self, origin: Origin, outgoing: list[Outgoing], settles: Key | None) -> None:
        """Hand over a record's outputs; `settles` is the request they settle, if any."""


class DirectOutbox:
    """Send at once and wait for every acknowledgement; then the request is notified."""

    def __init__(self, producer: KeyedProducer, notified: Callable[..., None]) -> None:
        self._producer = producer
        self._notified = notified

    def deliver(self, origin: Origin, outgoing: list[Outgoing], settles: Key | None) -> None:
        # All are sent before the first is waited for: a stage that feeds the next and tells
        # the bot would otherwise wait for two acknowledgements one after the other.
        pending = [self._producer.send(o.topic, value=o.value, key=o.key, headers=o.headers)
                   for o in outgoing]
        for delivery in pending:
            delivery.result(DELIVERY_TIMEOUT_S)
        if settles is not None:
            self._notified(settles)


class TransactionFenced(RuntimeError):
    """Another producer with the member's transactional id started: this one is a zombie."""


@dataclass
class _Handed:
    outgoing: list[Outgoing]
    settles: Key | None


class TransactionalOutbox:
    """The member's transactional producer and the outputs waiting for their offsets' commit.

    Workers hand outputs over (`deliver`); the member's poll loop commits (`commit`), the only
    thread that touches the producer. A commit never takes longer than `call_budget_s`, so a
    cluster that stops answering cannot hold the poll loop past `max.poll.interval.ms`: the
    member stays in its group and tries again with its next commit.
    """

    def __init__(self, kafka: KafkaConnection, profile: str, transactional_id: str,
                 notified: Callable[..., None], *, transaction_timeout_ms: int,
                 call_budget_s: float = DELIVERY_TIMEOUT_S, batch_records: int | None = None) -> None:
        transactional: dict[str, Any] = {"transactional.id": transactional_id,
                                         "transaction.timeout.ms": transaction_timeout_ms}
        self._config = profiles.producer_config(profile, kafka, batch_records=batch_records, **transactional)
        self._budget_s = call_budget_s
        self._notified = notified
        self._lock = threading.Lock()
        self._handed: dict[Position, dict[int, _Handed]] = {}
        self._unmarked: list[Key] = []  # committed, notified_at not written yet (database down)
        self._in_doubt: _InDoubt | None = None
        self._timed_out = False  # a call timed out since the last commit
        self.transactions = 0
        self.aborted = 0
        self.replaced = 0
        # Fences an earlier producer of this id (a member that died mid-transaction): its open
        # transaction is aborted now rather than holding read_committed readers until it times out.
        # A cluster that cannot do that at start-up fails the member, loudly.
        self._producer = Producer(self._config)
        self._producer.init_transactions(DELIVERY_TIMEOUT_S)
        self._ready = True

    def deliver(self, origin: Origin, outgoing: list[Outgoing], settles: Key | None) -> None:
        with self._lock:
            self._handed.setdefault((origin.topic, origin.partition), {})[origin.offset] = \
                _Handed(list(outgoing), settles)

    def waiting(self) -> int:
        """Records whose outputs wait for their offsets' commit."""
        with self._lock:
            return sum(len(by_offset) for by_offset in self._handed.values())

    def drop(self, tps: Iterable[Position]) -> None:
        """Forget the outputs of partitions the member no longer owns: the records will be
        handled again by their next owner, who sends their outputs."""
        with self._lock:
            for tp in tps:
                self._handed.pop(tp, None)
                if self._in_doubt is not None:
                    self._in_doubt.forget(tp)

    def commit(self, positions: dict[Position, int], consumer: Consumer) -> bool:
        """Produce the outputs of the records below `positions` and commit those positions, in
        one transaction. False when it did not commit (the group moved on, the cluster failed
        it or did not answer in time): nothing of it is visible, the outputs stay handed over
        and the positions uncommitted, for the next commit or the partitions' next owner."""
        if not positions:
            return True
        deadline = time.monotonic() + self._budget_s
        if not self._ready and not self._init(deadline):
            return False
        if self._in_doubt is not None and not self._resolve(consumer, deadline):
            return False
        taken = self._take(positions)
        try:
            self._producer.begin_transaction()
            for handed in taken.values():
                for o in handed.outgoing:
                    self._produce(o, deadline)
            self._producer.send_offsets_to_transaction(
                [TopicPartition(t, p, o) for (t, p), o in positions.items()],
                consumer.consumer_group_metadata(), _left(deadline))
            self._commit_transaction(deadline)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not (error.fatal() or error.txn_requires_abort() or error.retriable()):
                raise
            log.warning("transaction of %s failed: %s", sorted(positions), error)
            self.aborted += 1
            self._timed_out = self._timed_out or error.code() in TIMEOUTS
            if error.fatal():
                self._fenced(error)
            if not error.fatal() and self._abort(deadline):
                self._give_back(taken)
            else:
                self._replace(positions, taken)
            return False
        self.transactions += 1
        self._timed_out = False
        self._mark_notified([h.settles for h in taken.values() if h.settles is not None])
        return True

    def close(self) -> None:
        """An open transaction cannot be left behind: `commit` always ends the one it began."""
        self._producer.flush(DELIVERY_TIMEOUT_S)

    # ----------------------------------------------------------------- inside
    def _take(self, positions: dict[Position, int]) -> dict[tuple[str, int, int], _Handed]:
        """Remove and return the outputs of the records below the positions, in offset order."""
        taken: dict[tuple[str, int, int], _Handed] = {}
        with self._lock:
            for tp, position in positions.items():
                by_offset = self._handed.get(tp, {})
                for offset in sorted(o for o in by_offset if o < position):
                    taken[(*tp, offset)] = by_offset.pop(offset)
        return taken

    def _give_back(self, taken: dict[tuple[str, int, int], _Handed]) -> None:
        """Outputs of an aborted transaction wait again, unless a newer try replaced them."""
        with self._lock:
            for (topic, partition, offset), handed in taken.items():
                self._handed.setdefault((topic, partition), {}).setdefault(offset, handed)

    def _produce(self, o: Outgoing, deadline: float) -> None:
        while True:
            try:
                # the client's stubs forbid a header without a value, which Kafka allows
                self._producer.produce(o.topic, value=o.value, key=o.key, headers=o.headers)  # type: ignore[arg-type]
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "local queue still full",
                                                    retriable=True)) from None
                self._producer.poll(0.05)  # local queue full: let deliveries drain, then retry

    def _commit_transaction(self, deadline: float) -> None:
        """Commit, asking again while the client says it may be asked again (a slow
        coordinator), until the deadline; then the transaction fails like any other."""
        while True:
            try:
                self._producer.commit_transaction(_left(deadline))
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or time.monotonic() >= deadline:
                    raise

    def _abort(self, deadline: float) -> bool:
        """True once the transaction is known aborted; False when the client could not say."""
        try:
            self._producer.abort_transaction(_left(deadline))
            return True
        except KafkaException as exc:
            log.warning("abort failed: %s", exc.args[0])
            self._timed_out = self._timed_out or exc.args[0].code() in TIMEOUTS
            if exc.args[0].fatal():
                self._fenced(exc.args[0])
            return False

    def _fenced(self, error: KafkaError) -> None:
        """A producer fenced with no timeout before it was fenced by another of its id: this
        member is a zombie (its partitions' new owner runs under the same name), and goes down.
        After a timeout the client reports its own epoch bump as "fenced by a newer instance"
        too; that producer is only replaced (`_replace`)."""
        if not self._timed_out:
            raise TransactionFenced(f"transactional producer fenced: {error}")

    def _replace(self, positions: dict[Position, int], taken: dict[tuple[str, int, int], _Handed]) -> None:
        """A producer that cannot say how its transaction ended (fenced by its own epoch bump
        after a timeout, an abort that timed out) is replaced by a new one of the same id. The
        new one's `init_transactions` finishes the old transaction whichever way the coordinator
        decided; the group's committed offsets, which were in it, then tell which outputs went
        out with it (`_resolve`). Until then nothing else is committed, or those offsets would
        no longer tell."""
        self._in_doubt = _InDoubt(dict(positions), taken)
        self._producer = Producer(self._config)
        self._ready = False
        self.replaced += 1

    def _init(self, deadline: float) -> bool:
        try:
            self._producer.init_transactions(_left(deadline))
        except KafkaException as exc:
            if exc.args[0].fatal():
                raise TransactionFenced(f"transactional producer unusable: {exc.args[0]}") from exc
            log.warning("transactional producer not ready yet: %s", exc.args[0])
            return False
        self._ready = True
        return True

    def _resolve(self, consumer: Consumer, deadline: float) -> bool:
        """Settle the transaction in doubt from the offsets the group committed: a partition
        whose committed offset reached the tried position committed with its outputs (they are
        visible, their requests notified), the others' outputs wait again."""
        doubt = self._in_doubt
        assert doubt is not None
        asked = [TopicPartition(t, p) for t, p in doubt.positions]
        try:
            committed = consumer.committed(asked, _left(deadline)) if asked else []
        except KafkaException as exc:
            log.warning("committed offsets unknown yet: %s", exc.args[0])
            return False
        reached = {(tp.topic, tp.partition) for tp in committed
                   if tp.offset >= doubt.positions[(tp.topic, tp.partition)]}
        went = {k: h for k, h in doubt.taken.items() if k[:2] in reached}
        self._give_back({k: h for k, h in doubt.taken.items() if k[:2] not in reached})
        self._in_doubt = None
        if went:
            self.transactions += 1
            self._mark_notified([h.settles for h in went.values() if h.settles is not None])
        return True

    def _mark_notified(self, keys: list[Key]) -> None:
        """The committed outputs are visible: their requests' latency ends now. A database
        outage keeps them for the next commit (the figure is a measurement, not a state)."""
        pending = self._unmarked + keys
        try:
            self._notified(*pending)
            self._unmarked = []
        except Exception as exc:
            if failures.classify(exc).kind != failures.TRANSIENT:
                raise
            self._unmarked = pending


@dataclass
class _InDoubt:
    """A transaction whose end its producer could not report: what it tried to commit."""

    positions: dict[Position, int]
    taken: dict[tuple[str, int, int], _Handed]

    def forget(self, tp: Position) -> None:
        self.positions.pop(tp, None)
        self.taken = {k: h for k, h in self.taken.items() if k[:2] != tp}


def _left(deadline: float) -> float:
    """What remains of a commit's budget for one client call (a call given 0 would not wait at
    all, so never less than a tenth of a second)."""
    return max(0.1, deadline - time.monotonic())
