"""Kafka-level throughput on the same broker: the project's producer against Kafka's own
ProducerPerformance with the same record size, acks and batching, and per-partition consume
throughput. These measured figures feed the partition-sizing formula.
"""

from __future__ import annotations

import random
import re
import string
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer

from consumers.config import profiles
from consumers.config.kafka_connection import KafkaConnection
from consumers.kafka_clients.producer import KeyedProducer
from consumers.kafka_clients.provisioning import delete, provision
from infra import kafka_tools

PERF_LINE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)")


@dataclass(frozen=True)
class ProduceFigure:
    records_per_s: float
    mb_per_s: float


def _topic(kafka: KafkaConnection, partitions: int, rf: int) -> str:
    name = f"bench-produce-{uuid.uuid4().hex[:8]}"
    provision(kafka, [name], partitions, "throughput", rf)
    return name


def client_settings(profile: str) -> dict[str, object]:
    """The batching and durability settings both producers get, from the profile."""
    settings = profiles.get(profile).producer
    return {k: settings[k] for k in ("acks", "linger.ms", "batch.size", "compression.type",
                                     "enable.idempotence") if k in settings}


def project_producer(kafka: KafkaConnection, topic: str, records: int, size: int,
                     profile: str) -> ProduceFigure:
    producer = KeyedProducer(kafka, profile=profile, key_strategy="none")
    producer.send(topic, value=b"warm-up").result(30)  # connection and producer id, not timed
    # The same payload ProducerPerformance sends: random upper-case letters.
    value = bytes(random.choice(string.ascii_uppercase.encode()) for _ in range(size))
    started = time.perf_counter()
    tally = producer.send_many(topic, (value for _ in range(records)), (None for _ in range(records)))
    producer.close(120)
    elapsed = time.perf_counter() - started
    if tally.failed or tally.acked != records:
        raise RuntimeError(f"project producer: {tally.acked}/{records} acknowledged, {tally.first_errors}")
    return ProduceFigure(records / elapsed, records * size / elapsed / 1e6)


def producer_perftest(kafka: KafkaConnection, topic: str, records: int, size: int,
                      profile: str) -> ProduceFigure:
    """Kafka's ProducerPerformance, given the bootstrap list alone: it runs on the open dev stack."""
    props = [f"{k}={str(v).lower() if isinstance(v, bool) else v}"
             for k, v in client_settings(profile).items()]
    result = kafka_tools.run("producer-perf", "--topic", topic, "--num-records", str(records),
                             "--record-size", str(size), "--throughput", "-1",
                             "--producer-props", f"bootstrap.servers={kafka.bootstrap}", *props, capture=True)
    match = PERF_LINE.findall(result.stdout)
    if result.returncode != 0 or not match:
        raise RuntimeError(f"ProducerPerformance failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    _, rps, mbps = match[-1]
    return ProduceFigure(float(rps), float(mbps))


def consume_per_partition(kafka: KafkaConnection, topic: str, records: int) -> float:
    """Records/s one consumer reads from a single partition, end to end through the client."""
    consumer = Consumer(kafka.client(**{"group.id": f"bench-{uuid.uuid4().hex[:6]}",
                                        "auto.offset.reset": "earliest", "enable.auto.commit": False}))
    consumer.subscribe([topic])
    seen, started, ended = -1, None, None  # the warm-up record
    deadline = time.monotonic() + 120
    try:
        while seen < records and time.monotonic() < deadline:
            batch = consumer.consume(num_messages=10_000, timeout=1.0)
            if batch:  # timed to the last batch's arrival: the last read waits out its timeout
                ended = time.perf_counter()
                started = started or ended
            seen += sum(1 for m in batch if not m.error())
    finally:
        consumer.close()
    return seen / (ended - started) if started and ended > started else 0.0


def compare(kafka: KafkaConnection, records: int, size: int, partitions: tuple[int, ...], rf: int,
            profile: str = "throughput") -> dict[str, object]:
    """Both producers on fresh topics of each partition count, alternating to share drift."""
    rows, topics = [], []
    for count in partitions:
        topics += [_topic(kafka, count, rf), _topic(kafka, count, rf)]
        project = project_producer(kafka, topics[-2], records, size, profile)
        perftest = producer_perftest(kafka, topics[-1], records, size, profile)
        rows.append({"partitions": count, "project_records_per_s": round(project.records_per_s),
                     "perftest_records_per_s": round(perftest.records_per_s),
                     "project_mb_per_s": round(project.mb_per_s, 2),
                     "perftest_mb_per_s": round(perftest.mb_per_s, 2),
                     "ratio": round(project.records_per_s / perftest.records_per_s, 3)})
    single = _topic(kafka, 1, rf)
    one = project_producer(kafka, single, records, size, profile)
    consume_rps = consume_per_partition(kafka, single, records)
    delete(kafka, [*topics, single])
    best = rows[-1]
    return {"record_size": size, "records": records, "profile": profile,
            "settings": client_settings(profile), "by_partitions": rows,
            "project_records_per_s": best["project_records_per_s"],
            "perftest_records_per_s": best["perftest_records_per_s"], "ratio": best["ratio"],
            "produce_records_per_s_per_partition": round(one.records_per_s),
            "mb_per_s_per_partition": round(one.mb_per_s, 2),
            "consume_records_per_s_per_partition": round(consume_rps)}
