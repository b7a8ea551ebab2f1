"""Keyed producer with checked delivery.

Key strategies: `uuid` (a fresh key per event: spreads a burst over every partition),
`none` (no key: librdkafka's sticky partitioner puts a whole burst window on one partition,
the skew this platform exists to avoid), or `field:<name>` (the event's own field, for
per-entity ordering). Every send returns a Future resolved by the delivery report, so callers
that must not lose an event wait for it, and failures surface as exceptions, never silently.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from consumers.config import profiles
from consumers.config.kafka_connection import KafkaConnection
from consumers.kafka_clients import records


class DeliveryError(RuntimeError):
    """A record the broker did not acknowledge; `error` says why (None: not sent at all)."""

    def __init__(self, message: str, error: KafkaError | None = None) -> None:
        super().__init__(message)
        self.error = error


def check_key_strategy(strategy: str) -> str:
    """Return the strategy, or raise a clear error for an unknown one."""
    if strategy in ("uuid", "none") or (strategy.startswith("field:") and len(strategy) > 6):
        return strategy
    raise ValueError(f"unknown key strategy {strategy!r}; use uuid, none or field:<name>")


def key_for(strategy: str, event: dict[str, Any]) -> bytes | None:
    """The record key an event gets under a key strategy."""
    if strategy == "uuid":
        return uuid.uuid4().bytes
    if strategy == "none":
        return None
    if strategy.startswith("field:"):
        name = strategy.split(":", 1)[1]
        if name not in event:
            raise ValueError(f"key field {name!r} missing from event")
        return str(event[name]).encode()
    check_key_strategy(strategy)
    return None


class DeliveryTally:
    """Acknowledged and failed deliveries of a bulk send."""

    def __init__(self) -> None:
        self.acked = 0
        self.failed = 0
        self.first_errors: list[str] = []

    def on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.acked += 1
            return
        self.failed += 1
        if len(self.first_errors) < 10:
            self.first_errors.append(str(err))


class KeyedProducer:
    """A thread-safe producer whose sends resolve to (partition, offset) or DeliveryError.

    A background thread serves delivery callbacks so senders never have to poll.
    """

    def __init__(self, kafka: KafkaConnection, profile: str = "durability", key_strategy: str = "uuid",
                 partitioner: str = "murmur2_random", **overrides: Any) -> None:
        """`overrides` go to profiles.producer_config: its `batch_records`, or librdkafka settings."""
        self.key_strategy = check_key_strategy(key_strategy)
        self._producer = Producer(profiles.producer_config(profile, kafka,
                                                           partitioner=partitioner, **overrides))
        self._closing = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="producer-poll", daemon=True)
        self._poller.start()

    def _poll_loop(self) -> None:
        while not self._closing.is_set():
            self._producer.poll(0.1)

    def send(self, topic: str, event: dict[str, Any] | None = None, *, value: bytes | None = None,
             key: bytes | None = None, headers: list[records.Header] | None = None,
             partition: int | None = None) -> Future[tuple[int, int]]:
        """Send an event (JSON-encoded) or raw bytes; the key follows the strategy unless given."""
        from consumers.config.events import encode

        if value is None:
            if event is None:
                raise ValueError("send needs an event or a value")
            value = encode(event)
            if key is None:
                key = key_for(self.key_strategy, event)
        future: Future[tuple[int, int]] = Future()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                future.set_exception(DeliveryError(f"delivery to {topic} failed: {err}", err))
            else:
                future.set_result(records.place(msg)[1:])

        kwargs: dict[str, Any] = {"key": key, "value": value, "headers": headers,
                                  "on_delivery": on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                return future
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let deliveries drain, then retry

    def prepare(self, topics: Iterable[str], timeout_s: float = 10.0) -> None:
        """Fetch the topics' metadata up front, as a long-running producer already has it.

        Records sent before a topic's partitions are known wait unpartitioned and are then
        partitioned all at once, so a cold producer puts a whole keyless burst on one partition.
        """
        for topic in topics:
            self._producer.list_topics(topic, timeout=timeout_s)

    def send_many(self, topic: str, values: Iterable[bytes], keys: Iterable[bytes | None]) -> DeliveryTally:
        """Send raw records as fast as the client allows, counting acknowledgements in bulk.

        One shared callback instead of a Future per record: the path for bulk loads and the
        producer benchmark. Call `flush()` before reading the tally.
        """
        tally = DeliveryTally()
        produce = self._producer.produce
        for key, value in zip(keys, values, strict=True):
            while True:
                try:
                    produce(topic, value=value, key=key, on_delivery=tally.on_delivery)
                    break
                except BufferError:
                    self._producer.poll(0.05)
        return tally

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait for outstanding deliveries; return how many are still queued."""
        return self._producer.flush(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        remaining = self.flush(timeout_s)
        self._closing.set()
        self._poller.join()
        if remaining:
            raise DeliveryError(f"{remaining} records undelivered at close")
