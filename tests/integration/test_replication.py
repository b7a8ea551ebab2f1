"""Durability on the three-node cluster: RF=3, min ISR=2 survives the loss of one broker."""

from __future__ import annotations

import time

import pytest

from consumers.config.kafka_connection import KafkaConnection
from infra import stack as stack_cli
from tests.integration.kafka_helpers import consume_all, create_topic, produce
from tests.stack import Stack, unique

STOPPED = 3


def isr_without(kafka: KafkaConnection, topic: str, node: int, timeout_s: float = 60) -> list[list[int]]:
    """Wait until no partition's ISR includes `node`; return the ISRs."""
    admin = kafka.admin()
    deadline = time.monotonic() + timeout_s
    while True:
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        isrs = [sorted(p.isrs) for p in meta.partitions.values()]
        if all(node not in isr for isr in isrs) or time.monotonic() > deadline:
            return isrs
        time.sleep(0.5)


@pytest.mark.serial  # stops a broker of the stack: with no other test running
def test_acks_all_survives_one_broker_down(cluster: Stack) -> None:
    topic = unique("replicated")
    create_topic(cluster.connection, topic, partitions=3, replication=3,
                 config={"min.insync.replicas": "2"})
    durable = {"acks": "all", "enable.idempotence": True}
    before = [f"before-{i}" for i in range(200)]
    assert produce(cluster.connection, topic, before, **durable) == []

    stack_cli.stop_broker(cluster.layout, STOPPED)
    try:
        isrs = isr_without(cluster.connection, topic, STOPPED)
        assert all(len(isr) == 2 and STOPPED not in isr for isr in isrs), isrs

        after = [f"after-{i}" for i in range(200)]
        assert produce(cluster.connection, topic, after, **durable) == []
        received = consume_all(cluster.connection, topic, expected=400)
    finally:
        stack_cli.start_broker(cluster.layout, STOPPED)

    assert sorted(received) == sorted(before + after)
