"""Small Kafka helpers shared by integration tests."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import NewTopic

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
    import time

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
