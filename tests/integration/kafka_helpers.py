"""Small Kafka helpers shared by integration tests. Whether groups have handled every record
(`wait_committed_to_end`) is the event a test waits for before it asserts that something did
not happen (a second call, a record left behind)."""

from __future__ import annotations

import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.figures import read_to_end
from consumers.config.kafka_connection import KafkaConnection


def create_topic(kafka: KafkaConnection, name: str, partitions: int = 1, replication: int = 1,
                 config: dict[str, str] | None = None) -> None:
    admin = kafka.admin()
    futures = admin.create_topics([NewTopic(name, partitions, replication, config=config or {})])
    futures[name].result(timeout=30)


def produce(kafka: KafkaConnection, topic: str, values: list[str], **config: object) -> list[str]:
    """Produce keyed values; return the delivery errors (empty when all were acknowledged)."""
    producer = Producer(kafka.client(**config))
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    for i, value in enumerate(values):
        producer.produce(topic, key=str(i).encode(), value=value.encode(), on_delivery=on_delivery)
        producer.poll(0)
    remaining = producer.flush(60)
    if remaining:
        errors.append(f"{remaining} messages still queued after flush")
    return errors


def consume_all(kafka: KafkaConnection, topic: str, expected: int, timeout_s: float = 60) -> list[str]:
    """Read a topic from the beginning until `expected` values arrived or the timeout passed."""
    consumer = Consumer(kafka.client(**{"group.id": f"read-{topic}", "auto.offset.reset": "earliest",
                                        "enable.auto.commit": False}))
    consumer.subscribe([topic])
    values: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=1.0):
                if msg.error():
                    raise RuntimeError(str(msg.error()))
                values.append(msg.value().decode())
    finally:
        consumer.close()
    return values


def committed_offsets(admin: AdminClient, group: str, topic: str) -> dict[int, int]:
    """Per partition of `topic`, the offset `group` committed (negative: none yet)."""
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
    result = admin.list_consumer_group_offsets([request])[group].result(10)
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def records_of(kafka: KafkaConnection, topic: str, starts: dict[int, int] | None = None) -> int:
    """The records a `read_committed` reader finds in `topic` (from `starts`, else from the
    beginning) up to its end: a topic written in transactions has a marker per transaction and
    partition, which takes an offset and is no record, so offsets do not count records."""
    reader = Consumer(kafka.client(**{"group.id": f"count-{topic}", "enable.auto.commit": False,
                                      "isolation.level": "read_committed"}))
    try:
        return len(read_to_end(reader, topic, starts))
    finally:
        reader.close()


def wait_committed_to_end(kafka: KafkaConnection, groups: dict[str, str], timeout_s: float
                          ) -> dict[str, tuple[dict[int, int], int]]:
    """Per topic (committed offsets, records past them) once no group (`groups`: topic -> group)
    has a record left past its committed offsets, or at the timeout."""
    admin = kafka.admin()
    deadline = time.monotonic() + timeout_s
    while True:
        state = {}
        for topic, group in groups.items():
            committed = committed_offsets(admin, group, topic)
            starts = {p: o if o >= 0 else OFFSET_BEGINNING for p, o in committed.items()}
            state[topic] = (committed, records_of(kafka, topic, starts))
        if all(left == 0 for _, left in state.values()) or time.monotonic() > deadline:
            return state
        time.sleep(0.25)
