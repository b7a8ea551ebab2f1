"""What each outbox sends and when: at once and acknowledged (direct), or in the transaction
that commits the offsets the outputs answer, and only those (transactional)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import psycopg2
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from consumers import outbox
from consumers.kafka_connection import KafkaConnection
from consumers.outbox import DirectOutbox, Outgoing, TransactionalOutbox, TransactionFenced
from consumers.storage import Key, Origin


class AckedTogether:
    """A producer whose sends are acknowledged only once `expected` of them were sent."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.futures: list[Future] = []

    def send(self, topic: str, **record: Any) -> Future:
        self.futures.append(Future())
        if len(self.futures) == self.expected:
            for i, future in enumerate(self.futures):
                future.set_result((0, i))
        return self.futures[-1]


def test_a_record_sends_every_output_before_waiting_for_the_acknowledgements(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Had the first send been waited for before the second was sent, its acknowledgement (which
    # comes only with the second) would never arrive.
    monkeypatch.setattr(outbox, "DELIVERY_TIMEOUT_S", 0.5)
    producer, notified = AckedTogether(expected=2), []
    direct = DirectOutbox(producer, notified.append)  # type: ignore[arg-type]
    direct.deliver(Origin("m", "t", 0, 1), [Outgoing("a", b"1"), Outgoing("b", b"2")], KEY)
    assert [f.result(0) for f in producer.futures] == [(0, 0), (0, 1)]
    assert notified == [KEY]


KEY = Key("p", "r1", "run")


class FakeTransactions:
    """confluent_kafka.Producer's transactional calls, kept in order; `fail` makes the next
    call of that name raise the given error."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.calls: list[tuple[Any, ...]] = []
        self.fail: dict[str, KafkaError] = {}

    def _call(self, name: str, *args: Any) -> None:
        if name in self.fail:
            raise KafkaException(self.fail.pop(name))
        self.calls.append((name, *args))

    def init_transactions(self, timeout: float) -> None:
        self._call("init")

    def begin_transaction(self) -> None:
        self._call("begin")

    def produce(self, topic: str, value: bytes, key: bytes | None, headers: Any) -> None:
        self._call("produce", topic, value)

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], metadata: Any,
                                    timeout: float) -> None:
        self._call("offsets", sorted((o.topic, o.partition, o.offset) for o in offsets), metadata)

    def commit_transaction(self, timeout: float) -> None:
        self._call("commit")

    def abort_transaction(self, timeout: float) -> None:
        self._call("abort")

    def flush(self, timeout: float) -> int:
        return 0


class Group:
    def consumer_group_metadata(self) -> str:
        return "generation 7"


class Notified:
    """storage.mark_notified: fails while `down`, as during a database outage."""

    def __init__(self) -> None:
        self.keys: list[Key] = []
        self.down = False

    def __call__(self, *keys: Key) -> None:
        if self.down:
            raise psycopg2.OperationalError("server closed the connection unexpectedly")
        self.keys.extend(keys)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[FakeTransactions]:
    made: list[FakeTransactions] = []
    monkeypatch.setattr(outbox, "Producer", lambda config: made.append(FakeTransactions(config)) or made[-1])
    return made


def transactional(notified: Notified) -> TransactionalOutbox:
    kafka = KafkaConnection({"bootstrap.servers": "localhost:1"})
    return TransactionalOutbox(kafka, "durability", "g.check-0", notified, transaction_timeout_ms=10_000)


def hand(box: TransactionalOutbox, partition: int, offset: int, value: bytes,
         settles: Key | None = None) -> None:
    box.deliver(Origin("check-0", "in", partition, offset), [Outgoing("out", value)], settles)


def test_the_producer_is_transactional_and_fences_its_predecessor_first(fake: list[FakeTransactions]) -> None:
    transactional(Notified())
    assert fake[0].config["transactional.id"] == "g.check-0"
    assert fake[0].config["transaction.timeout.ms"] == 10_000
    assert fake[0].calls == [("init",)]


def test_outputs_go_out_with_the_offsets_they_answer_and_no_further(fake: list[FakeTransactions]) -> None:
    notified = Notified()
    box = transactional(notified)
    hand(box, 0, 5, b"a", KEY)
    hand(box, 0, 7, b"c")  # completed past offset 6, which is still in flight
    hand(box, 1, 3, b"x")
    assert box.commit({("in", 0): 6, ("in", 1): 4}, Group()) is True  # type: ignore[arg-type]
    assert fake[0].calls[1:] == [
        ("begin",), ("produce", "out", b"a"), ("produce", "out", b"x"),
        ("offsets", [("in", 0, 6), ("in", 1, 4)], "generation 7"), ("commit",)]
    assert notified.keys == [KEY] and box.waiting() == 1
    # offset 6 done (its outputs too): 7's outputs go with the commit that passes it
    hand(box, 0, 6, b"b")
    box.commit({("in", 0): 8}, Group())  # type: ignore[arg-type]
    assert [c[2] for c in fake[0].calls if c[0] == "produce"][2:] == [b"b", b"c"]
    assert box.waiting() == 0


def test_a_record_handled_again_hands_over_its_outputs_once(fake: list[FakeTransactions]) -> None:
    box = transactional(Notified())
    hand(box, 0, 5, b"first try")
    hand(box, 0, 5, b"second try")
    box.commit({("in", 0): 6}, Group())  # type: ignore[arg-type]
    assert [c[2] for c in fake[0].calls if c[0] == "produce"] == [b"second try"]


def test_an_aborted_transaction_keeps_the_outputs_for_the_next(fake: list[FakeTransactions]) -> None:
    box = transactional(Notified())
    hand(box, 0, 5, b"a")
    # a rebalance moved the group on: the coordinator refuses this member's generation
    fake[0].fail["offsets"] = KafkaError(KafkaError.ILLEGAL_GENERATION, txn_requires_abort=True)
    assert box.commit({("in", 0): 6}, Group()) is False  # type: ignore[arg-type]
    assert fake[0].calls[-1] == ("abort",) and box.waiting() == 1
    assert box.commit({("in", 0): 6}, Group()) is True  # type: ignore[arg-type]
    assert fake[0].calls[-3:] == [("produce", "out", b"a"), ("offsets", [("in", 0, 6)], "generation 7"),
                                  ("commit",)]


def test_a_fenced_producer_takes_the_member_down(fake: list[FakeTransactions]) -> None:
    box = transactional(Notified())
    hand(box, 0, 5, b"a")
    fake[0].fail["commit"] = KafkaError(KafkaError._FENCED, fatal=True)
    with pytest.raises(TransactionFenced):
        box.commit({("in", 0): 6}, Group())  # type: ignore[arg-type]


def test_a_slow_coordinator_is_asked_again(fake: list[FakeTransactions]) -> None:
    box = transactional(Notified())
    hand(box, 0, 5, b"a")
    fake[0].fail["commit"] = KafkaError(KafkaError._TIMED_OUT, retriable=True)
    assert box.commit({("in", 0): 6}, Group()) is True  # type: ignore[arg-type]
    assert [c[0] for c in fake[0].calls].count("commit") == 1 and box.transactions == 1


def test_partitions_given_back_lose_their_waiting_outputs(fake: list[FakeTransactions]) -> None:
    box = transactional(Notified())
    hand(box, 0, 5, b"a")
    hand(box, 1, 5, b"b")
    box.drop([("in", 0)])
    box.commit({("in", 0): 6, ("in", 1): 6}, Group())  # type: ignore[arg-type]
    assert [c[2] for c in fake[0].calls if c[0] == "produce"] == [b"b"]


def test_requests_are_notified_after_a_database_outage(fake: list[FakeTransactions]) -> None:
    notified = Notified()
    box = transactional(notified)
    notified.down = True
    hand(box, 0, 5, b"a", Key("p", "r1", "run"))
    assert box.commit({("in", 0): 6}, Group()) is True  # type: ignore[arg-type]
    assert notified.keys == []
    notified.down = False
    hand(box, 0, 6, b"b", Key("p", "r2", "run"))
    box.commit({("in", 0): 7}, Group())  # type: ignore[arg-type]
    assert [k.request_id for k in notified.keys] == ["r1", "r2"]
