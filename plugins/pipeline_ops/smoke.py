"""A round trip through Kafka from inside Airflow, to prove the wiring end to end."""

from __future__ import annotations

import time
import uuid
from typing import Any

from airflow.providers.apache.kafka.hooks.client import KafkaAdminClientHook
from airflow.providers.apache.kafka.hooks.consume import KafkaConsumerHook
from airflow.providers.apache.kafka.hooks.produce import KafkaProducerHook
from airflow.sdk import BaseOperator


class KafkaRoundTripOperator(BaseOperator):
    """Create a one-off topic, produce a nonce to it, consume it back, delete the topic.

    Fails when the message does not come back intact within `timeout_s`: a task that
    succeeds has shown that the connection, the broker and both client paths work.
    """

    template_fields = ("topic_prefix",)

    def __init__(self, *, kafka_config_id: str = "kafka_default", topic_prefix: str = "smoke",
                 timeout_s: float = 60.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kafka_config_id = kafka_config_id
        self.topic_prefix = topic_prefix
        self.timeout_s = timeout_s

    def execute(self, context: Any) -> dict[str, Any]:
        nonce = uuid.uuid4().hex
        topic = f"{self.topic_prefix}-{nonce[:12]}"
        admin = KafkaAdminClientHook(kafka_config_id=self.kafka_config_id)
        admin.create_topic([(topic, 1, 1)])
        try:
            started = time.monotonic()
            producer = KafkaProducerHook(kafka_config_id=self.kafka_config_id).get_producer()
            producer.produce(topic, key=nonce.encode(), value=nonce.encode())
            if producer.flush(self.timeout_s) != 0:
                raise RuntimeError(f"message to {topic} not delivered within {self.timeout_s}s")
            received = self._consume_one(topic)
            if received != nonce:
                raise RuntimeError(f"round trip through {topic} returned {received!r}, sent {nonce!r}")
            elapsed_ms = (time.monotonic() - started) * 1000
            self.log.info("round trip through %s in %.0f ms", topic, elapsed_ms)
            return {"topic": topic, "round_trip_ms": round(elapsed_ms, 1)}
        finally:
            admin.delete_topic([topic])

    def _consume_one(self, topic: str) -> str | None:
        consumer = KafkaConsumerHook([topic], kafka_config_id=self.kafka_config_id).get_consumer()
        try:
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                if msg.error():
                    raise RuntimeError(f"consume from {topic} failed: {msg.error()}")
                return (msg.value() or b"").decode()
            return None
        finally:
            consumer.close()
