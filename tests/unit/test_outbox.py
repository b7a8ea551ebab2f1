"""What each outbox sends and when: at once and acknowledged (direct), or in the transaction
that commits the offsets the outputs answer, and only those (transactional)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import psycopg2
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from consumers.config.kafka_connection import KafkaConnection
from consumers.runtime import outbox
from consumers.runtime.outbox import DirectOutbox, Outgoing, TransactionalOutbox, TransactionFenced
from consumers.runtime.storage import Key, Origin


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


class Cluster:
    """A clock and a cluster that can stop answering: while `frozen`, every call waits out
    the timeout it was given, then times out."""

    def __init__(self) -> None:
        self.now = 0.0
        self.frozen = False
        self.committed: dict[tuple[str, int], int] = {}  # the group's offsets, as the coordinator has them

    def monotonic(self) -> float:
        return self.now

    def answer(self, timeout: float) -> None:
        if self.frozen:
            self.now += timeout
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, retriable=True))


class FakeTransactions:
    """confluent_kafka.Producer's transactional calls, kept in order; `fail` makes the next
    call of that name raise the given error. A committed transaction's offsets become the
    group's."""

    def __init__(self, config: dict[str, Any], cluster: Cluster) -> None:
        self.config = config
        self.cluster = cluster
        self.calls: list[tuple[Any, ...]] = []
        self.fail: dict[str, KafkaError] = {}
        self._offsets: dict[tuple[str, int], int] = {}

    def _call(self, name: str, *args: Any, timeout: float = 0.0) -> None:
        self.cluster.answer(timeout)
        if name in self.fail:
            raise KafkaException(self.fail.pop(name))
        self.calls.append((name, *args))

    def init_transactions(self, timeout: float) -> None:
        self._call("init", timeout=timeout)

    def begin_transaction(self) -> None:
        self._offsets = {}
        self._call("begin")

    def produce(self, topic: str, value: bytes, key: bytes | None, headers: Any) -> None:
        self.calls.append(("produce", topic, value))  # local: queued whatever the cluster does

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], metadata: Any,
                                    timeout: float) -> None:
        self._call("offsets", sorted((o.topic, o.partition, o.offset) for o in offsets), metadata,
                   timeout=timeout)
        self._offsets = {(o.topic, o.partition): o.offset for o in offsets}

    def commit_transaction(self, timeout: float) -> None:
        self._call("commit", timeout=timeout)
        self.cluster.committed.update(self._offsets)

    def abort_transaction(self, timeout: float) -> None:
        self._call("abort", timeout=timeout)

    def flush(self, timeout: float) -> int:
        return 0


class Group:
    """The member's consumer: its group metadata, and the group's committed offsets."""

    def __init__(self, cluster: Cluster | None = None) -> None:
        self.cluster = cluster or Cluster()

    def consumer_group_metadata(self) -> str:
        return "generation 7"

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.cluster.answer(timeout)
        offsets = self.cluster.committed
        return [TopicPartition(tp.topic, tp.partition, offsets.get((tp.topic, tp.partition), -1001))
                for tp in partitions]


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
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    made = Cluster()
    monkeypatch.setattr(outbox, "time", made)
    return made


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, cluster: Cluster) -> list[FakeTransactions]:
    made: list[FakeTransactions] = []
    monkeypatch.setattr(outbox, "Producer",
                        lambda config: made.append(FakeTransactions(config, cluster)) or made[-1])
    return made


BUDGET_S = 15.0


def transactional(notified: Notified) -> TransactionalOutbox:
    kafka = KafkaConnection({"bootstrap.servers": "localhost:1"})
    return TransactionalOutbox(kafka, "durability", "g.check-0", notified, transaction_timeout_ms=10_000,
                               call_budget_s=BUDGET_S)


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


def produced(fakes: list[FakeTransactions]) -> list[bytes]:
    return [c[2] for f in fakes for c in f.calls if c[0] == "produce"]


TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, retriable=True)
FENCED = KafkaError(KafkaError._FENCED, fatal=True)


def test_a_producer_fenced_out_of_the_blue_takes_the_member_down(fake: list[FakeTransactions]) -> None:
    # another producer of its id started: its partitions' new owner runs under its name
    box = transactional(Notified())
    hand(box, 0, 5, b"a")
    fake[0].fail["commit"] = FENCED
    with pytest.raises(TransactionFenced):
        box.commit({("in", 0): 6}, Group())  # type: ignore[arg-type]


def test_a_producer_fenced_after_a_timeout_is_replaced_and_its_aborted_outputs_go_with_the_next(
        fake: list[FakeTransactions], cluster: Cluster) -> None:
    # librdkafka reports its own epoch bump after a timed-out request as a fatal "fenced by a
    # newer instance": the producer cannot say whether the commit went through
    box = transactional(Notified())
    group = Group(cluster)
    hand(box, 0, 5, b"a")
    fake[0].fail["offsets"] = TIMED_OUT
    assert box.commit({("in", 0): 6}, group) is False  # type: ignore[arg-type]
    fake[0].fail["commit"] = FENCED
    assert box.commit({("in", 0): 6}, group) is False  # type: ignore[arg-type]
    assert len(fake) == 2 and box.replaced == 1
    # the coordinator did not commit it (no offset reached 6): the output goes again, once
    hand(box, 0, 6, b"b")
    assert box.commit({("in", 0): 7}, group) is True  # type: ignore[arg-type]
    assert [c[0] for c in fake[1].calls] == ["init", "begin", "produce", "produce", "offsets", "commit"]
    assert produced(fake[1:]) == [b"a", b"b"] and cluster.committed == {("in", 0): 7}


def test_a_commit_that_went_through_unreported_is_not_sent_again(
        fake: list[FakeTransactions], cluster: Cluster) -> None:
    notified = Notified()
    box = transactional(notified)
    group = Group(cluster)
    hand(box, 0, 5, b"a", KEY)
    hand(box, 1, 2, b"x")
    fake[0].fail["offsets"] = TIMED_OUT
    assert box.commit({("in", 0): 6, ("in", 1): 3}, group) is False  # type: ignore[arg-type]

    def committed_then_fenced(timeout: float) -> None:  # the answer to a commit that happened is lost
        cluster.committed.update({("in", 0): 6, ("in", 1): 3})
        raise KafkaException(FENCED)

    fake[0].commit_transaction = committed_then_fenced  # type: ignore[method-assign]
    assert box.commit({("in", 0): 6, ("in", 1): 3}, group) is False  # type: ignore[arg-type]
    hand(box, 0, 6, b"b")
    assert box.commit({("in", 0): 7, ("in", 1): 3}, group) is True  # type: ignore[arg-type]
    # a and x went once, with the transaction that committed; the aborted first one is not read
    assert produced(fake[1:]) == [b"b"] and box.waiting() == 0
    assert notified.keys == [KEY]


def test_a_cluster_that_stops_answering_never_holds_a_commit_past_its_budget(
        fake: list[FakeTransactions], cluster: Cluster) -> None:
    box = transactional(Notified())
    group = Group(cluster)
    hand(box, 0, 5, b"a")
    cluster.frozen = True
    for _ in range(4):  # the poll loop's commits while the cluster is frozen: the first one's
        started = cluster.now  # transaction and abort time out, the producer is replaced, and
        assert box.commit({("in", 0): 6}, group) is False  # type: ignore[arg-type]
        assert cluster.now - started <= BUDGET_S + 0.1  # its initialisation waits for the cluster
    assert len(fake) == 2 and produced(fake[1:]) == []
    cluster.frozen = False
    assert box.commit({("in", 0): 6}, group) is True  # type: ignore[arg-type]
    assert produced(fake[1:]) == [b"a"] and cluster.committed == {("in", 0): 6}


def test_partitions_given_back_while_a_commit_is_in_doubt_are_not_settled_by_this_member(
        fake: list[FakeTransactions], cluster: Cluster) -> None:
    box = transactional(Notified())
    group = Group(cluster)
    hand(box, 0, 5, b"a")
    hand(box, 1, 5, b"b")
    fake[0].fail["offsets"] = TIMED_OUT
    box.commit({("in", 0): 6, ("in", 1): 6}, group)  # type: ignore[arg-type]
    fake[0].fail["commit"] = FENCED
    assert box.commit({("in", 0): 6, ("in", 1): 6}, group) is False  # type: ignore[arg-type]
    box.drop([("in", 0)])  # its next owner handles offset 5 again and sends its output
    assert box.commit({("in", 1): 6}, group) is True  # type: ignore[arg-type]
    assert produced(fake[1:]) == [b"b"]


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
