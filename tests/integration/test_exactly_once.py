"""Exactly-once outputs against the real brokers, counted by Kafka's own console consumer: a
member whose group moved on cannot commit its outputs, a restarted member fences the one that
died, and a pipeline run's outputs are each seen once by a `read_committed` reader."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer

from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.config.kafka_connection import KafkaConnection
from consumers.runs.pipeline_run import running_pipeline
from consumers.runtime.outbox import Outgoing, TransactionalOutbox, TransactionFenced
from consumers.runtime.storage import Origin
from infra.kafka_tools import topic_values
from tests.integration.kafka_helpers import committed_offsets, create_topic, produce
from tests.integration.pipeline_fixtures import TIME_SCALE, AIService, ai_service, query
from tests.stack import Stack


def outbox(kafka: KafkaConnection, transactional_id: str) -> TransactionalOutbox:
    return TransactionalOutbox(kafka, "durability", transactional_id, lambda *keys: None,
                               transaction_timeout_ms=10_000)


def member(kafka: KafkaConnection, group: str, topic: str) -> Consumer:
    """A group member with a short session, polled until it holds the topic's partition. It is
    not polled again while the tests start transactional producers beside it, which took over
    3 s on a busy machine: its poll interval allows for that (past it, the member leaves and a
    commit meant to pass is refused as from an unknown member)."""
    consumer = Consumer(kafka.client(**{"group.id": group, "enable.auto.commit": False,
                                        "auto.offset.reset": "earliest", "session.timeout.ms": 3000,
                                        "heartbeat.interval.ms": 500, "max.poll.interval.ms": 60000}))
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    while not consumer.assignment():
        assert time.monotonic() < deadline, "never assigned"
        consumer.poll(0.2)
    return consumer


class Generation:
    """A member's group metadata as it was when taken: what a zombie commits with."""

    def __init__(self, metadata: object) -> None:
        self.metadata = metadata

    def consumer_group_metadata(self) -> object:
        return self.metadata


def test_a_member_whose_group_moved_on_cannot_commit_its_outputs(stack: Stack) -> None:
    kafka, run = stack.connection, uuid.uuid4().hex[:8]
    source, out, group = f"eos-in-{run}", f"eos-out-{run}", f"eos-{run}"
    create_topic(kafka, source)
    create_topic(kafka, out)
    assert produce(kafka, source, ["request"]) == []
    zombie = member(kafka, group, source)
    late = outbox(kafka, f"{group}.zombie")
    late.deliver(Origin("zombie", source, 0, 0), [Outgoing(out, b"from the zombie")], None)
    # The zombie goes on with the generation it had, after it left and another member took the
    # partition (a rebalance starts a new generation).
    stale = Generation(zombie.consumer_group_metadata())
    zombie.close()
    owner = member(kafka, group, source)
    assert late.commit({(source, 0): 1}, stale) is False  # type: ignore[arg-type]
    assert late.aborted == 1
    current = outbox(kafka, f"{group}.owner")
    current.deliver(Origin("owner", source, 0, 0), [Outgoing(out, b"from the owner")], None)
    assert current.commit({(source, 0): 1}, owner) is True
    owner.close()
    assert topic_values(kafka, [out])[out] == ["from the owner"]
    assert committed_offsets(kafka.admin(), group, source) == {0: 1}


def test_a_restarted_member_fences_the_one_that_died(stack: Stack) -> None:
    kafka, run = stack.connection, uuid.uuid4().hex[:8]
    source, out, group = f"eos-in-{run}", f"eos-out-{run}", f"eos-{run}"
    create_topic(kafka, source)
    create_topic(kafka, out)
    assert produce(kafka, source, ["a", "b"]) == []
    consumer = member(kafka, group, source)
    first = outbox(kafka, f"{group}.check-0")
    first.deliver(Origin("check-0", source, 0, 0), [Outgoing(out, b"a answered")], None)
    assert first.commit({(source, 0): 1}, consumer) is True
    first.deliver(Origin("check-0", source, 0, 1), [Outgoing(out, b"b answered by the first")], None)
    restarted = outbox(kafka, f"{group}.check-0")  # same member, new process
    with pytest.raises(TransactionFenced):
        first.commit({(source, 0): 2}, consumer)
    restarted.deliver(Origin("check-0", source, 0, 1), [Outgoing(out, b"b answered again")], None)
    assert restarted.commit({(source, 0): 2}, consumer) is True
    consumer.close()
    assert topic_values(kafka, [out])[out] == ["a answered", "b answered again"]
    assert committed_offsets(kafka.admin(), group, source) == {0: 2}


@pytest.fixture(scope="module")
def ai() -> AIService:
    with ai_service() as service:
        yield service


def test_every_output_of_a_run_is_read_once(stack: Stack, ai: AIService) -> None:
    requests = 60
    config = PipelineConfig(partitions=4, time_scale=TIME_SCALE, replication_factor=1, exactly_once=True,
                            stages={"check": StageConfig("flow", members=2, window=8),
                                    "generate": StageConfig("flow", members=2, window=8)})
    ai.reset()
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints) as pipeline:
        pipeline.send(requests, reject_share=0.25)
        counts = pipeline.wait_terminal(requests, timeout_s=120)
    assert sum(counts.values()) == requests and set(counts) <= {"completed", "rejected"}, counts
    spec = config.spec
    written = sorted({t for stage in spec.stage_names for t in spec.outputs_of(stage)})
    read = topic_values(stack.connection, [pipeline.topics.name(t) for t in written])
    sent = Counter()
    for topic, values in read.items():
        for value in values:
            event = json.loads(value)
            sent[topic, event[spec.key], event.get("kind")] += 1
    assert sent and max(sent.values()) == 1, [k for k, n in sent.items() if n > 1]
    # each request's final message, once: as many as the requests that settled
    notify = pipeline.topics.name("notify")
    finals = {rid for topic, rid, kind in sent if topic == notify and kind in ("result", "rejected")}
    assert len(finals) == requests
    notified = query(stack.database_url, "SELECT count(*) FROM requests WHERE run_id = %s "
                     "AND notified_at IS NOT NULL", pipeline.run_id)
    assert notified == [(requests,)]
