"""Produce and consume through the real broker."""

from __future__ import annotations

from tests.integration.kafka_helpers import consume_all, create_topic, produce
from tests.stack import Stack, unique


def test_produce_and_consume_every_message(stack: Stack) -> None:
    topic = unique("roundtrip")
    create_topic(stack.connection, topic, partitions=4)
    sent = [f"message-{i}" for i in range(500)]

    assert produce(stack.connection, topic, sent, acks="all") == []
    received = consume_all(stack.connection, topic, expected=len(sent))

    assert sorted(received) == sorted(sent)
