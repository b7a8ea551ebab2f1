"""Synthetic load: N records written to a topic fast, spread over partitions with a chosen skew.

The partition of every record is chosen here, not by the partitioner, so the skew is exactly
the one asked for and the returned per-partition counts are the truth the analysis jobs are
checked against. Counts per partition are the largest-remainder apportionment of N by the
skew's weights; records go out in chunks, each chunk carrying its share of every partition,
so the load is spread evenly over the run's duration.

Skews: `uniform`; `zipf:S` (partition i gets weight 1 / (i + 1)^S, partition 0 hottest);
`hot:P:SHARE` (partition P gets SHARE of the records, the rest uniform); `weights:W0,W1,...`.
Keys: `uuid` (16 random bytes per record, as the keyed producer sends), `none`, or `card:N`
(N distinct keys in rotation). Values are drawn from a pool of random byte strings.

The producer is tuned for bulk loading (acks=1 from the availability profile, big lz4 batches,
a deep local queue); only failed deliveries call back, so the loop stays tight.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import NewTopic
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from consumers.config import kafka_connection, profiles
from consumers.config.kafka_connection import KafkaConnection

BULK_CONFIG: dict[str, Any] = {
    "acks": 1,
    "enable.idempotence": False,
    "compression.type": "lz4",
    "linger.ms": 50,
    "batch.size": 1_048_576,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 2_097_152,
    "delivery.report.only.error": True,
}
CHUNK = 50_000
VALUE_POOL = 1024


def skew_weights(spec: str, partitions: int) -> list[float]:
    """Relative weight of each partition for a skew spec (see the module docstring)."""
    kind, _, rest = spec.partition(":")
    if kind == "uniform" and not rest:
        return [1.0] * partitions
    if kind == "zipf" and rest:
        exponent = float(rest)
        return [1.0 / (i + 1) ** exponent for i in range(partitions)]
    if kind == "hot" and rest.count(":") == 1:
        hot, share = int(rest.split(":")[0]), float(rest.split(":")[1])
        if not 0 <= hot < partitions or not 0 <= share <= 1:
            raise ValueError(f"hot partition must be in [0, {partitions}) and share in [0, 1]: {spec}")
        cold = (1 - share) / (partitions - 1) if partitions > 1 else 0.0
        return [share if p == hot else cold for p in range(partitions)]
    if kind == "weights" and rest:
        weights = [float(w) for w in rest.split(",")]
        if len(weights) != partitions:
            raise ValueError(f"{len(weights)} weights for {partitions} partitions: {spec}")
        return weights
    raise ValueError(f"unknown skew {spec!r}; use uniform, zipf:S, hot:P:SHARE or weights:W0,W1,...")


def apportion(total: int, weights: list[float]) -> list[int]:
    """Split `total` in proportion to `weights`, exactly (largest remainder, ties to low index)."""
    scale = sum(weights)
    if scale <= 0 or min(weights) < 0:
        raise ValueError("weights must be non-negative with a positive sum")
    exact = [total * w / scale for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def schedule(counts: list[int], chunk: int = CHUNK) -> Iterator[list[tuple[int, int]]]:
    """Chunks of (partition, records): every chunk carries its share of each partition."""
    chunks = max(1, -(-sum(counts) // chunk))
    for i in range(chunks):
        yield [(p, n * (i + 1) // chunks - n * i // chunks) for p, n in enumerate(counts)]


class Keys:
    """Record keys for a key mode, made in bulk so the produce loop only indexes a list."""

    def __init__(self, mode: str) -> None:
        kind, _, rest = mode.partition(":")
        if mode in ("uuid", "none"):
            self.cycle: list[bytes] | None = None
        elif kind == "card" and rest.isdigit() and int(rest) > 0:
            self.cycle = [f"key-{i}".encode() for i in range(int(rest))]
        else:
            raise ValueError(f"unknown key mode {mode!r}; use uuid, none or card:N")
        self.mode = mode
        self._next = 0

    def take(self, n: int) -> list[bytes | None]:
        if self.mode == "none":
            return [None] * n
        if self.cycle is None:
            block = os.urandom(16 * n)
            return [block[i : i + 16] for i in range(0, 16 * n, 16)]
        size, start = len(self.cycle), self._next
        self._next = (start + n) % size
        return [self.cycle[(start + i) % size] for i in range(n)]


def ensure_topic(kafka: KafkaConnection, topic: str, partitions: int | None, replication: int,
                 timeout_s: float = 60) -> int:
    """The topic's partition count, creating the topic when it does not exist yet.

    After a creation, waits until every partition has a leader in the metadata: records sent
    to a partition the client does not know yet wait in a side queue, and the brokers are
    still busy creating the logs.
    """
    admin = kafka.admin()
    existing = admin.list_topics(topic=topic, timeout=30).topics.get(topic)
    if existing is not None and existing.error is None:
        if partitions is not None and partitions != len(existing.partitions):
            raise ValueError(f"{topic} has {len(existing.partitions)} partitions, not {partitions}")
        return len(existing.partitions)
    if partitions is None:
        raise ValueError(f"{topic} does not exist: give the partition count to create it")
    admin.create_topics([NewTopic(topic, partitions, replication)])[topic].result(timeout=30)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions \
                and all(p.leader >= 0 for p in meta.partitions.values()):
            return partitions
        time.sleep(0.2)
    raise TimeoutError(f"{topic}: partitions without a leader after {timeout_s}s")


def generate(kafka: KafkaConnection, topic: str, records: int, *, skew: str = "uniform", keys: str = "uuid",
             record_size: int = 100, partitions: int | None = None, replication: int = 1,
             progress: bool = True, **overrides: Any) -> dict[int, int]:
    """Produce `records` records and return the records acknowledged per partition.

    Raises RuntimeError when any record was not acknowledged (the counts would be wrong).
    """
    count = ensure_topic(kafka, topic, partitions, replication)
    planned = apportion(records, skew_weights(skew, count))
    failed = 0
    errors: list[str] = []

    def on_error(err: KafkaError | None, msg: Message) -> None:
        nonlocal failed
        if err is not None:
            failed += 1
            if len(errors) < 5:
                errors.append(str(err))

    producer = Producer(profiles.producer_config(
        "availability", kafka, **{**BULK_CONFIG, "on_delivery": on_error, **overrides}))
    values = itertools.cycle([os.urandom(record_size) for _ in range(VALUE_POOL)])
    key_maker = Keys(keys)
    with _progress(progress) as bar:
        task = bar.add_task(f"{topic}", total=records)
        for chunk in schedule(planned):
            _produce_chunk(producer, topic, chunk, key_maker.take(sum(n for _, n in chunk)), values)
            bar.advance(task, sum(n for _, n in chunk))
        left = producer.flush(120)
    if left or failed:
        raise RuntimeError(f"{failed} records failed, {left} still queued: {errors}")
    return dict(enumerate(planned))


def _produce_chunk(producer: Producer, topic: str, chunk: list[tuple[int, int]], keys: list[Any],
                   values: Iterator[bytes]) -> None:
    """The hot loop: one positional produce() per record, a poll per partition slice."""
    produce, poll = producer.produce, producer.poll
    start = 0
    for partition, n in chunk:
        for key, value in zip(keys[start : start + n], values, strict=False):
            try:
                produce(topic, value, key, partition)
            except BufferError:  # local queue full: serve deliveries until there is room
                while True:
                    poll(0.05)
                    try:
                        produce(topic, value, key, partition)
                        break
                    except BufferError:
                        continue
        start += n
        poll(0)


def _progress(enabled: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                    disable=not enabled)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kafka_connection.add_argument(parser)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--partitions", type=int,
                        help="partition count (creates the topic when missing; checked when it exists)")
    parser.add_argument("--replication", type=int, default=1, help="replication of a created topic")
    parser.add_argument("--skew", default="uniform",
                        help="uniform | zipf:S | hot:P:SHARE | weights:W0,W1,...")
    parser.add_argument("--keys", default="uuid", help="uuid | none | card:N")
    parser.add_argument("--record-size", type=int, default=100, help="value bytes per record")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    kafka = kafka_connection.from_args(args, parser).default
    ensure_topic(kafka, args.topic, args.partitions, args.replication)
    started = time.perf_counter()
    counts = generate(kafka, args.topic, args.records, skew=args.skew, keys=args.keys,
                      record_size=args.record_size, partitions=args.partitions,
                      replication=args.replication, progress=not args.quiet)
    elapsed = time.perf_counter() - started
    print(json.dumps({"topic": args.topic, "records": args.records, "seconds": round(elapsed, 3),
                      "records_per_s": round(args.records / elapsed), "partitions": counts}))


if __name__ == "__main__":
    main()
