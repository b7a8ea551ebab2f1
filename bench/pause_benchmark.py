"""The pause benchmark of the flow-control article: 10 partitions, 9 paused at random before
each poll, one record processed per poll, for a fixed time.

naive  pause the 9 partitions and resume the chosen one before every poll, as an application
       doing per-poll back-pressure would; librdkafka discards the paused partitions'
       fetched data each time, and fetches it again later.
flow   the flow consumer's strategy (`FetchBuffer`): never pause per poll; keep fetched
       records in per-partition queues, serve the chosen partition from its queue, pause only
       coarsely when the buffer is full (after draining what librdkafka holds).

Both report records processed and bytes fetched from the brokers (librdkafka statistics,
which count re-fetched data); fetch amplification = records fetched / distinct records
fetched (all records have the same size, so it is the byte ratio too).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from consumers.config import profiles
from consumers.config.kafka_connection import KafkaConnection
from consumers.kafka_clients.provisioning import delete
from consumers.loadgen import datagen
from consumers.runtime.fetch_buffer import FetchBuffer

PARTITIONS = 10


@dataclass
class PauseFigures:
    records: int
    fetched_bytes: int
    fetched_records: int  # re-fetches included
    distinct_records: int  # distinct offsets ever fetched

    @property
    def amplification(self) -> float:
        return self.fetched_records / self.distinct_records if self.distinct_records else float("nan")


class _Stats:
    """librdkafka statistics: what was received (re-fetches included) and, per partition, the
    highest fetch position reached: the topic starts at offset 0, so that is the number of
    distinct records fetched."""

    def __init__(self) -> None:
        self.rxbytes = 0
        self.rxmsgs = 0
        self.positions: dict[str, int] = {}

    def __call__(self, raw: str) -> None:
        parts = {pid: p for t in json.loads(raw).get("topics", {}).values()
                 for pid, p in t.get("partitions", {}).items() if pid != "-1"}
        self.rxbytes = sum(p.get("rxbytes", 0) for p in parts.values())
        self.rxmsgs = sum(p.get("rxmsgs", 0) for p in parts.values())
        for pid, p in parts.items():
            self.positions[pid] = max(self.positions.get(pid, 0), p.get("next_offset", 0))

    def figures(self, records: int) -> PauseFigures:
        return PauseFigures(records, self.rxbytes, self.rxmsgs, sum(self.positions.values()))


def fill_topic(kafka: KafkaConnection, records_per_partition: int, size: int) -> str:
    """A fresh topic with `records_per_partition` records in each partition, every one of them
    acknowledged (datagen's bulk path: a Future per record used to cost this fill 13-16 s of CPU
    and left failed deliveries unnoticed)."""
    topic = f"bench-pause-{uuid.uuid4().hex[:8]}"
    datagen.generate(kafka, topic, PARTITIONS * records_per_partition, keys="none", record_size=size,
                     partitions=PARTITIONS, progress=False)
    return topic


def _consumer(kafka: KafkaConnection, topic: str, stats: _Stats) -> Consumer:
    """Both strategies use the flow consumer's client settings (small prefetch)."""
    config = profiles.consumer_config("durability", kafka, f"pause-{uuid.uuid4().hex[:6]}",
                                      mode="flow")
    consumer = Consumer({**config, "statistics.interval.ms": 200, "stats_cb": stats})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    return consumer


def naive(kafka: KafkaConnection, topic: str, seconds: float, seed: int = 1) -> PauseFigures:
    stats, rng = _Stats(), random.Random(seed)
    consumer = _consumer(kafka, topic, stats)
    parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    records = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        chosen = rng.randrange(PARTITIONS)
        consumer.resume([parts[chosen]])
        consumer.pause([p for p in parts if p.partition != chosen])
        for msg in consumer.consume(num_messages=1, timeout=0.5):
            if msg.error() is None:
                records += 1
    consumer.close()
    return stats.figures(records)


def flow(kafka: KafkaConnection, topic: str, seconds: float, seed: int = 1,
         buffer: int = 2000) -> PauseFigures:
    stats, rng = _Stats(), random.Random(seed)
    consumer = _consumer(kafka, topic, stats)
    fetched = FetchBuffer(consumer, high=buffer)
    records = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        fetched.poll(0 if len(fetched) else 0.05)
        if fetched.pop_from((topic, rng.randrange(PARTITIONS))) is not None:
            records += 1
    consumer.close()
    return stats.figures(records)


def run(kafka: KafkaConnection, seconds: float = 10.0, records_per_partition: int = 50_000,
        size: int = 100) -> dict[str, float]:
    """Both strategies on one pre-filled topic, one after the other."""
    topic = fill_topic(kafka, records_per_partition, size)
    n, f = naive(kafka, topic, seconds), flow(kafka, topic, seconds)
    delete(kafka, [topic])
    return {"seconds": seconds, "record_size": size, "naive_records": n.records,
            "flow_records": f.records, "naive_fetched_bytes": n.fetched_bytes,
            "flow_fetched_bytes": f.fetched_bytes,
            "naive_fetch_amplification": round(n.amplification, 3),
            "flow_fetch_amplification": round(f.amplification, 3),
            "naive_fetched_bytes_per_record": round(n.fetched_bytes / max(1, n.records)),
            "flow_fetched_bytes_per_record": round(f.fetched_bytes / max(1, f.records)),
            "topic_records": PARTITIONS * records_per_partition}
