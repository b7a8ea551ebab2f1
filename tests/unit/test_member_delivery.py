"""A member's commits under failures, driven through a scripted consumer (no broker).

The fake stands in for confluent-kafka's `Consumer` inside `consumers.runtime.group_member`: it serves
records of one partition, runs the group callbacks (assign, revoke, lost) inside `consume()`
as librdkafka does, and records every commit. The stage's work is replaced by a function the
test scripts, so each test decides which record fails, how, and when it finishes.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import psycopg2
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from consumers.config import pipeline_spec
from consumers.config.events import Topics
from consumers.config.kafka_connection import KafkaConnection
from consumers.kafka_clients.producer import DeliveryError
from consumers.runtime import group_member
from consumers.runtime import member as member_module
from consumers.runtime.fleet import MEMBER_KINDS
from consumers.runtime.group_member import GroupMember
from consumers.runtime.member import MemberSettings
from consumers.runtime.outbox import Outgoing
from consumers.runtime.storage import Key
from consumers.runtime.window_pool import WindowPool

TOPIC = "unit.style"
TP = (TOPIC, 0)


class FakeMessage:
    def __init__(self, offset: int) -> None:
        self._offset = offset
        self._value = json.dumps({"request_id": str(uuid.UUID(int=offset)), "run_id": "r", "style": "minimal",
                                  "description": "d", "produced_at": time.time()}).encode()

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def key(self) -> None:
        return None

    def headers(self) -> None:
        return None

    def error(self) -> None:
        return None


class FakeConsumer:
    """One partition's records from the committed position; group events queued by the test."""

    instance: FakeConsumer | None = None

    def __init__(self, config: dict[str, Any]) -> None:
        self.end = 0  # records 0 .. end-1 exist
        self.position = 0
        self.commits: list[int] = []
        self.assigned = False
        self.group_events: deque[str] = deque(["assign"])
        self.lock = threading.Lock()
        self.on_commit = config.get("on_commit")
        self.answers: deque[tuple[KafkaError | None, list[TopicPartition]]] = deque()
        self.refuse_next_commits = 0  # asynchronous commits the coordinator answers with an error
        self.generation_gone = False  # synchronous commits refused until the member polls again
        self.polls = 0
        self.consumes = 0  # the member's loop fetches once a round
        FakeConsumer.instance = self

    def subscribe(self, topics: list[str], on_assign: Callable, on_revoke: Callable,
                  on_lost: Callable) -> None:
        self.callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}

    def _serve_group_event(self) -> None:
        with self.lock:
            event = self.group_events.popleft() if self.group_events else None
        if event is None:
            return
        self.assigned = event == "assign"
        if event == "assign":  # fetching starts again from the committed position
            self.position = self.commits[-1] if self.commits else 0
        self.callbacks[event](self, [TopicPartition(TOPIC, 0)])

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[FakeMessage]:
        self.consumes += 1
        while self.answers:  # commit callbacks are served inside consume, as librdkafka does
            self.on_commit(*self.answers.popleft())
        self._serve_group_event()
        if not self.assigned or self.position >= self.end:
            time.sleep(min(max(timeout, 0), 0.01))
            return []
        batch = [FakeMessage(o) for o in range(self.position, min(self.end, self.position + num_messages))]
        self.position += len(batch)
        return batch

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        """Only commits the coordinator took are in `commits`; asynchronous ones are answered
        through `on_commit` at the next consume."""
        if not asynchronous and self.generation_gone:
            raise KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION))
        if asynchronous and self.refuse_next_commits:
            self.refuse_next_commits -= 1
            self.answers.append((KafkaError(KafkaError.REBALANCE_IN_PROGRESS), offsets))
            return
        self.commits += [tp.offset for tp in offsets]
        if asynchronous:
            self.answers.append((None, offsets))

    def seek(self, tp: TopicPartition) -> None:
        self.position = tp.offset

    def poll(self, timeout: float) -> None:
        """The rejoin a moved generation asks for: commits are taken again after it."""
        self.polls += 1
        self.generation_gone = False

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, 0)] if self.assigned else []

    def pause(self, partitions: list[TopicPartition]) -> None:
        pass

    def resume(self, partitions: list[TopicPartition]) -> None:
        pass

    def close(self) -> None:
        if self.assigned:
            self.callbacks["revoke"](self, [TopicPartition(TOPIC, 0)])

    def queue(self, *events: str) -> None:
        with self.lock:
            self.group_events.extend(events)


class Script:
    """The stage's work: per offset, a list of behaviours for its successive tries."""

    def __init__(self) -> None:
        self.plans: dict[int, deque[Callable[[], None]]] = {}
        self.calls: list[int] = []
        self.finished: list[int] = []

    def plan(self, offset: int, *tries: Callable[[], None]) -> None:
        self.plans[offset] = deque(tries)

    def __call__(self, ctx: Any, event: dict[str, Any], origin: Any, *state: Any) -> SimpleNamespace:
        self.calls.append(origin.offset)
        tries = self.plans.get(origin.offset)
        if tries:
            tries.popleft()()
        self.finished.append(origin.offset)
        return SimpleNamespace(skipped_duplicate=False, tries=[])  # what earlier handlers returned


def database_down() -> None:
    raise psycopg2.OperationalError("connection to server at 127.0.0.1 failed: Connection refused")


def blocked_until(event: threading.Event) -> Callable[[], None]:
    return lambda: event.wait(10)


def defect() -> None:
    raise KeyError("a defect no retry fixes")


def producer_fatal() -> None:
    raise DeliveryError("delivery failed", KafkaError(KafkaError._FATAL, "producer fenced", fatal=True))


class Sink:
    """Dead letters sent and stored: must stay empty unless a record is its own fault."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def deliver(self, origin: Any, outgoing: list[Outgoing], settles: Any) -> None:
        self.sent.extend(record.topic for record in outgoing)


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Script:
    script = Script()
    monkeypatch.setattr(group_member, "Consumer", FakeConsumer)
    monkeypatch.setattr(member_module, "handle", script)
    return script


@pytest.fixture
def sink() -> Sink:
    return Sink()


def make_member(mode: str, sink: Sink, windows: WindowPool | None = None) -> GroupMember:
    storage = SimpleNamespace(record_rebalance=lambda *a: None, record_stats=lambda *a: None,
                              record_dead_letter=lambda *a: sink.sent.append("table"))
    topics = Topics("unit", pipeline_spec.load("genai_image"))
    ctx = SimpleNamespace(topics=topics, storage=storage, outbox=sink, entry=True, ai=None, windows=windows,
                          loans=None,
                          key=lambda event: Key("genai_image", event["request_id"], event["run_id"]),
                          outgoing=lambda topic, event: Outgoing(topic, b"{}"))
    settings = MemberSettings(run_id="r", stage="check", mode=mode, group_id="g",
                              kafka=KafkaConnection.plain("unused"), time_scale=0.02, window=4, buffer=8,
                              batch_size=1, commit_interval_s=0.01,
                              revoke_deadline_s=2.0)
    return MEMBER_KINDS[mode]("check-0", settings, ctx)


class Running:
    """A member consuming on a thread, and the failure it ended with."""

    def __init__(self, member: GroupMember) -> None:
        self.member = member
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.member.run(self.stop)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            self.error = exc

    @property
    def consumer(self) -> FakeConsumer:
        assert FakeConsumer.instance is not None
        return FakeConsumer.instance


@contextmanager
def running(member: GroupMember, records: int) -> Iterator[Running]:
    """The member consuming `records` records; stopped (and checked stopped) afterwards."""
    run = Running(member)
    FakeConsumer.instance = None
    run.thread.start()
    wait_for(lambda: FakeConsumer.instance is not None and FakeConsumer.instance.assigned)
    run.consumer.end = records
    try:
        yield run
    finally:
        run.stop.set()
        run.thread.join(10)
    assert not run.thread.is_alive(), "the member did not stop"


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def wait_rounds(consumer: FakeConsumer, rounds: int = 10) -> None:
    """Until the member's loop has gone round `rounds` more times, each round at least a commit
    interval here: what it would have done by then (commit, start a record), it has done."""
    start = consumer.consumes
    wait_for(lambda: consumer.consumes >= start + rounds)


def highest_commit(consumer: FakeConsumer) -> int:
    return max(consumer.commits, default=0)


@pytest.mark.parametrize("mode", ["flow", "bounded"])
def test_a_failing_dependency_is_retried_and_never_committed_past(script: Script, sink: Sink,
                                                                    mode: str) -> None:
    script.plan(1, database_down, database_down, database_down)
    with running(make_member(mode, sink), records=3) as run:
        wait_for(lambda: script.calls.count(1) >= 2)
        assert highest_commit(run.consumer) <= 1  # record 1 waits: nothing past it is committed
        wait_for(lambda: highest_commit(run.consumer) == 3)
    assert script.calls.count(1) == 4  # three failures, then the try that completed it
    assert sink.sent == []  # a database outage is not the record's fault: no dead letter
    assert run.error is None


@pytest.mark.parametrize(("failure", "cause"), [(defect, KeyError), (producer_fatal, DeliveryError)])
def test_a_failure_no_one_can_judge_ends_the_member_without_committing_it(
        script: Script, sink: Sink, failure: Callable[[], None], cause: type) -> None:
    script.plan(1, failure)
    with running(make_member("flow", sink), records=3) as run:
        run.thread.join(10)
    assert isinstance(run.error, RuntimeError) and isinstance(run.error.__cause__, cause)
    assert run.member.failure is run.error
    assert highest_commit(run.consumer) == 1  # 0 done; 1 neither handled nor dead-lettered
    assert sink.sent == []


def test_a_late_completion_from_a_lost_assignment_does_not_complete_the_new_copy(
        script: Script, sink: Sink) -> None:
    first_copy, second_copy = threading.Event(), threading.Event()
    script.plan(1, blocked_until(first_copy), blocked_until(second_copy))
    with running(make_member("flow", sink), records=3) as run:
        wait_for(lambda: script.calls.count(1) == 1 and highest_commit(run.consumer) == 1)
        run.consumer.queue("lost", "assign")  # the partition is lost, then comes back
        wait_for(lambda: script.calls.count(1) == 2)  # offset 1 consumed again: second copy runs
        first_copy.set()  # the first copy finishes late
        wait_for(lambda: script.finished.count(1) == 1)
        wait_rounds(run.consumer)
        assert highest_commit(run.consumer) == 1, "committed past a record still being processed"
        second_copy.set()
        wait_for(lambda: highest_commit(run.consumer) == 3)
    assert run.error is None


def test_revoking_a_waiting_record_commits_below_it_and_the_next_owner_completes_it(
        script: Script, sink: Sink) -> None:
    script.plan(1, *[database_down] * 1000)
    with running(make_member("flow", sink), records=3) as run:
        wait_for(lambda: script.calls.count(1) >= 2)
        run.consumer.queue("revoke")
        wait_for(lambda: not run.consumer.assigned and not run.member.assignment)
        assert highest_commit(run.consumer) == 1  # 0 and 2 done, 1 still waits: commit 1
        tries_at_revoke = script.calls.count(1)
        wait_rounds(run.consumer, 30)
        assert script.calls.count(1) <= tries_at_revoke + 1, "kept retrying a partition it gave back"
        script.plan(1)  # the dependency is back
        run.consumer.queue("assign")
        wait_for(lambda: highest_commit(run.consumer) == 3)
    assert sink.sent == [] and run.error is None


def test_a_refused_asynchronous_commit_is_sent_again(script: Script, sink: Sink) -> None:
    with running(make_member("flow", sink), records=3) as run:
        run.consumer.refuse_next_commits = 1_000_000
        wait_for(lambda: script.finished.count(2) == 1)
        wait_for(lambda: run.consumer.refuse_next_commits <= 1_000_000 - 5)  # five commits refused
        assert highest_commit(run.consumer) == 0
        run.consumer.refuse_next_commits = 0  # the coordinator takes commits again
        wait_for(lambda: highest_commit(run.consumer) == 3)  # the same position, sent again
    assert run.error is None


def test_a_last_commit_refused_for_a_moved_generation_is_made_after_polling_the_new_one(
        script: Script, sink: Sink) -> None:
    # A fleet's members stop together; the first to leave moves the group's generation on, and
    # the others' last commit is refused until they have polled the new one.
    with running(make_member("flow", sink), records=3) as run:
        run.consumer.refuse_next_commits = 1_000_000  # nothing committed while running
        wait_for(lambda: script.finished.count(2) == 1)
        run.consumer.generation_gone = True
    assert run.error is None
    assert run.consumer.polls >= 1 and highest_commit(run.consumer) == 3


def test_a_flow_member_uses_the_window_its_fleet_mates_leave(script: Script, sink: Sink) -> None:
    """Window 4 per member, two members pooled (8); the other member holds 2 records."""
    release = threading.Event()
    for offset in range(10):
        script.plan(offset, blocked_until(release))
    pool = WindowPool(8)
    pool.hold("check-1", 2)
    with running(make_member("flow", sink, windows=pool), records=10) as run:
        wait_for(lambda: len(script.calls) == 6)  # 8 - 2: more than its own window of 4
        wait_rounds(run.consumer)
        assert len(script.calls) == 6, "started more records than the pool had free"
        pool.hold("check-1", 0)  # the other member finished its records
        wait_for(lambda: len(script.calls) == 8)
        wait_rounds(run.consumer)
        assert len(script.calls) == 8
        release.set()
        wait_for(lambda: highest_commit(run.consumer) == 10)
    assert run.error is None
