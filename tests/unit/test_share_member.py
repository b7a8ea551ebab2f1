"""A share-group member's acknowledgements, driven through a scripted share consumer (no broker).

The fake stands in for confluent-kafka's `ShareConsumer` inside `consumers.runtime.share_member`: it
serves the batches a test queues, one per poll, and keeps each record's acknowledgement. Like
the client in explicit mode it refuses to poll while a record of the previous batch is not
acknowledged, and an acknowledgement from any thread but the polling one. The stage's work is
the scripted function of the consumer-group tests, so each test decides which record fails, how.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, IllegalStateException, ShareConsumer

from consumers.ai.client import AIUnavailable
from consumers.config import pipeline_spec, profiles
from consumers.config.events import Topics
from consumers.config.kafka_connection import KafkaConnection
from consumers.runtime import member as member_module
from consumers.runtime import share_member
from consumers.runtime.member import MemberSettings
from consumers.runtime.outbox import Outgoing
from consumers.runtime.share_member import ShareMember
from consumers.runtime.storage import Key
from tests.unit.test_member_delivery import FakeMessage, Script, database_down, defect, wait_for
from tests.unit.test_member_delivery import Running as MemberThread

ACCEPT, RELEASE, REJECT = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT
WINDOW = 4
EVENTS: list[str] = []  # the order of group configuration and subscription


class ShareMessage(FakeMessage):
    """A record as a share consumer delivers it: with its delivery count."""

    def __init__(self, offset: int, deliveries: int = 1, value: bytes | None = None) -> None:
        super().__init__(offset)
        self._deliveries = deliveries
        if value is not None:
            self._value = value

    def delivery_count(self) -> int:
        return self._deliveries


class FakeShareConsumer:
    instance: FakeShareConsumer | None = None
    first_assignment_size = 1  # what the statistics of the first polls say

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.batches: deque[list[ShareMessage]] = deque()
        self.acks: dict[int, AcknowledgeType] = {}
        self.pending: set[int] = set()  # delivered by the last poll, not acknowledged yet
        self.polls = 0
        self.assignment_size = self.first_assignment_size
        self.poll_thread: threading.Thread | None = None
        self.closed = False
        FakeShareConsumer.instance = self

    def set_acknowledgement_commit_callback(self, callback: Any) -> None:
        self.on_acknowledged = callback

    def subscribe(self, topics: list[str]) -> None:
        EVENTS.append("subscribe")

    def poll(self, timeout: float) -> list[ShareMessage]:
        if self.pending:
            raise IllegalStateException(f"records {sorted(self.pending)} are not acknowledged")
        self.poll_thread = threading.current_thread()
        self.polls += 1
        self.config["stats_cb"](json.dumps({"cgrp": {"assignment_size": self.assignment_size}}))
        batch = self.batches.popleft() if self.batches else []
        if not batch:
            time.sleep(0.01)
        self.pending = {m.offset() for m in batch}
        return batch

    def acknowledge(self, msg: ShareMessage, ack: AcknowledgeType) -> None:
        if threading.current_thread() is not self.poll_thread:
            raise IllegalStateException("acknowledged from another thread than the polling one")
        self.pending.remove(msg.offset())
        self.acks[msg.offset()] = ack

    def close(self) -> None:
        self.closed = True



class DeadLetters:
    """The dead-letter topic and table: the reason each record went there with, by offset."""

    def __init__(self) -> None:
        self.sent: dict[int, str] = {}
        self.stored: dict[int, str] = {}

    def deliver(self, origin: Any, outgoing: list[Outgoing], settles: Key | None) -> None:
        for record in outgoing:
            if record.headers is not None:  # the letter; the failure notice has none
                found = dict(record.headers)
                self.sent[int(found["source_offset"])] = found["reason"].decode()

    def record(self, pipeline: str, run_id: str, key: Key | None, stage: str, reason: str, origin: Any,
               payload: bytes | None, entry: bool, kafka_key: bytes | None = None) -> None:
        self.stored[origin.offset] = reason


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Script:
    script = Script()
    EVENTS.clear()
    monkeypatch.setattr(share_member, "ShareConsumer", FakeShareConsumer)
    monkeypatch.setattr(share_member.provisioning, "configure_share_group",
                        lambda kafka, group_id, time_scale: EVENTS.append(f"configure {group_id}"))
    monkeypatch.setattr(member_module, "handle", script)
    return script


@pytest.fixture
def dead() -> DeadLetters:
    return DeadLetters()


class Running(MemberThread):
    """A share member consuming on a thread, and the failure it ended with."""

    @property
    def consumer(self) -> FakeShareConsumer:
        assert FakeShareConsumer.instance is not None
        return FakeShareConsumer.instance

    def serve(self, *batch: ShareMessage) -> None:
        self.consumer.batches.append(list(batch))

    def acknowledged(self, count: int) -> dict[int, AcknowledgeType]:
        wait_for(lambda: len(self.consumer.acks) >= count)
        return self.consumer.acks


def make_member(dead: DeadLetters, group_events: list[tuple[str, list[str]]]) -> ShareMember:
    storage = SimpleNamespace(record_rebalance=lambda run, group, member, event, parts: group_events.append(
                                  (event, parts)),
                              record_stats=lambda *a: None, record_dead_letter=dead.record)
    ctx = SimpleNamespace(topics=Topics("unit", pipeline_spec.load("genai_image")), storage=storage,
                          outbox=dead, entry=True, ai=None,
                          key=lambda event: Key("genai_image", event["request_id"], event["run_id"]),
                          outgoing=lambda topic, event: Outgoing(topic, b"{}"))
    settings = MemberSettings(run_id="r", stage="check", mode="share", group_id="unit.check",
                              kafka=KafkaConnection.plain("unused"), time_scale=0.02, window=WINDOW)
    return ShareMember("check-0", settings, ctx)


@contextmanager
def running(dead: DeadLetters, group_events: list | None = None) -> Iterator[Running]:
    """A member polling the fake; stopped (and checked stopped and closed) afterwards."""
    FakeShareConsumer.instance = None
    run = Running(make_member(dead, [] if group_events is None else group_events))
    run.thread.start()
    wait_for(lambda: FakeShareConsumer.instance is not None and FakeShareConsumer.instance.polls > 0)
    try:
        yield run
    finally:
        run.stop.set()
        run.thread.join(10)
    assert not run.thread.is_alive(), "the member did not stop"
    assert run.consumer.closed


@pytest.fixture
def short_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries end 0.3 s after the poll (2% of the 15 s lock) instead of 7.5 s."""
    monkeypatch.setattr(share_member, "LOCK_SHARE_FOR_RETRIES", 0.02)


def test_a_batch_runs_on_window_workers_and_is_acknowledged_from_the_polling_thread(
        script: Script, dead: DeadLetters) -> None:
    busy, peak, lock = [0], [0], threading.Lock()

    def call() -> None:
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
        time.sleep(0.1)
        with lock:
            busy[0] -= 1

    for offset in range(6):
        script.plan(offset, call)
    with running(dead) as run:
        # The broker rounds a poll up to whole producer batches: six records for a window of four.
        run.serve(*(ShareMessage(o) for o in range(6)))
        acks = run.acknowledged(6)
    assert run.consumer.config["max.poll.records"] == WINDOW
    assert run.consumer.config["share.acknowledgement.mode"] == "explicit"
    assert EVENTS == ["configure unit.check", "subscribe"]  # the group starts at earliest
    assert peak[0] == WINDOW  # at once, but never more than the window
    assert acks == dict.fromkeys(range(6), ACCEPT)
    assert run.error is None and dead.sent == {}


def test_each_record_is_accepted_rejected_or_released_by_whose_fault_its_failure_is(
        script: Script, dead: DeadLetters, short_lock: None) -> None:
    def ai_refuses() -> None:
        raise AIUnavailable("http 400: unsupported style", final=True)

    script.plan(2, ai_refuses)
    script.plan(3, database_down)  # then succeeds
    script.plan(4, *[database_down] * 1000)
    with running(dead) as run:
        run.serve(ShareMessage(0), ShareMessage(1, value=b"{not json"), ShareMessage(2), ShareMessage(3),
                  ShareMessage(4))
        acks = run.acknowledged(5)
    assert acks == {0: ACCEPT, 1: REJECT, 2: REJECT, 3: ACCEPT, 4: RELEASE}
    assert {o for o, ack in acks.items() if ack == ACCEPT} == set(script.finished)  # only what was handled
    assert dead.sent == {1: "malformed_json", 2: "ai_unavailable"}
    assert {o: reason.split(":")[0] for o, reason in dead.stored.items()} == dead.sent
    assert script.calls.count(3) == 2  # retried in the worker, within the lock
    assert script.calls.count(4) >= 2  # retried until the lock's retry share ran out, then released
    assert run.error is None


def test_a_record_still_failing_at_its_last_delivery_is_dead_lettered_not_released(
        script: Script, dead: DeadLetters, short_lock: None) -> None:
    limit = profiles.SHARE_DELIVERY_COUNT_LIMIT
    script.plan(0, *[database_down] * 1000)
    script.plan(1, *[database_down] * 1000)
    with running(dead) as run:
        run.serve(ShareMessage(0, deliveries=limit), ShareMessage(1, deliveries=limit - 1))
        acks = run.acknowledged(2)
    assert acks == {0: REJECT, 1: RELEASE}  # the broker would archive 0 once released
    assert dead.sent == {0: "delivery_limit"}
    assert dead.stored[0] == f"delivery_limit: a dependency still failed at delivery {limit} of {limit}"
    assert run.error is None


def test_a_failure_no_rule_covers_releases_the_record_and_ends_the_member(
        script: Script, dead: DeadLetters) -> None:
    script.plan(1, defect)
    with running(dead) as run:
        run.serve(ShareMessage(0), ShareMessage(1), ShareMessage(2))
        run.thread.join(10)
    assert run.consumer.acks == {0: ACCEPT, 1: RELEASE, 2: ACCEPT}
    assert isinstance(run.error, RuntimeError) and isinstance(run.error.__cause__, KeyError)
    assert run.member.failure is run.error
    assert dead.sent == {} and dead.stored == {}


def test_stopping_releases_a_waiting_record_without_waiting_for_the_lock(
        script: Script, dead: DeadLetters) -> None:
    script.plan(0, *[database_down] * 1000)
    with running(dead) as run:
        run.serve(ShareMessage(0))
        wait_for(lambda: script.calls.count(0) >= 2)
        stopped_at = time.monotonic()
        run.stop.set()
        run.thread.join(10)
    assert time.monotonic() - stopped_at < 2.0  # its retries could have gone on for 7.5 s
    assert run.consumer.acks == {0: RELEASE}
    assert run.error is None and dead.sent == {}


def test_the_member_counts_as_assigned_once_its_statistics_show_partitions(
        script: Script, dead: DeadLetters, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeShareConsumer, "first_assignment_size", 0)
    events: list[tuple[str, list[str]]] = []
    with running(dead, events) as run:
        polls = run.consumer.polls
        wait_for(lambda: run.consumer.polls > polls + 2)
        assert not run.member.assigned_once.is_set() and events == []
        run.consumer.assignment_size = 2
        wait_for(run.member.assigned_once.is_set)
        run.consumer.assignment_size = 0
        wait_for(lambda: len(events) == 2)
    assert events == [("assign", []), ("revoke", [])]  # the client does not say which partitions


def test_share_settings_follow_the_time_scale_within_the_broker_bounds() -> None:
    assert [profiles.share_record_lock_ms(s) for s in (1.0, 0.75, 0.02, 3.0)] == [30_000, 22_500, 15_000,
                                                                                     60_000]
    assert profiles.share_group_configs(0.02) == {"share.auto.offset.reset": "earliest",
                                                  "share.record.lock.duration.ms": "15000"}
    config = profiles.share_consumer_config("durability", KafkaConnection.plain("127.0.0.1:1"), "g",
                                            window=8, time_scale=0.02)
    assert config["max.poll.records"] == 8 and config["share.acknowledgement.mode"] == "explicit"
    assert config["max.poll.interval.ms"] == 30_000  # twice the lock, above the scaled 6 s
    ShareConsumer(config).close()  # the client accepts every setting (it refuses unknown ones)
    with pytest.raises(ValueError, match="share_consumer_config"):
        profiles.consumer_config("durability", KafkaConnection.plain("b:1"), "g", mode="share")
