"""Produce and consume through the real broker."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from tests.integration.kafka_helpers import consume_all, create_topic, produce
from tests.stack import Stack, unique


def test_produce_and_consume_every_message(stack: Stack) -> None:
    topic = unique("roundtrip")
    create_topic(stack.connection, topic, partitions=4)
    sent = [f"message-{i}" for i in range(500)]

    assert produce(stack.connection, topic, sent, acks="all") == []
    received = consume_all(stack.connection, topic, expected=len(sent))

    assert sorted(received) == sorted(sent)


def test_partition_counts_from_the_watermarks(stack: Stack) -> None:
    topic = unique("counts")
    create_topic(stack.connection, topic, partitions=4)
    producer = Producer(stack.connection.client(acks="all"))
    for i in range(7):  # partitions 0, 1, 2, 0, 1, 2, 0: the last partition gets none
        producer.produce(topic, value=b"x", partition=i % 3)
    assert producer.flush(60) == 0

    assert stack.connection.partition_counts(topic) == [3, 2, 2, 0]
    with pytest.raises(LookupError, match="no-such-topic"):
        stack.connection.partition_counts(unique("no-such-topic"))
