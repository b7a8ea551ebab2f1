"""The event source: requests of the reference scenario, as a burst or at a steady rate.

    python -m consumers.source --prefix demo --run-id r1 --burst 1280
    python -m consumers.source --prefix demo --run-id r1 --rate 20 --duration 60 --keys none

Each request is an upload notification on `<prefix>.intake` followed by the user's style
choice on `<prefix>.style` (the AI stages' input). Every send is acknowledged before the
source reports success; a delivery failure stops it with the error.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from concurrent.futures import Future
from dataclasses import dataclass

from rich.progress import Progress

from consumers import events
from consumers.producer import KeyedProducer


@dataclass
class SourceReport:
    """What was sent: request ids in order and the partition each style event landed on."""

    request_ids: list[str]
    style_partitions: list[int]
    seconds: float

    def per_partition(self, partitions: int) -> list[int]:
        counts = [0] * partitions
        for p in self.style_partitions:
            counts[p] += 1
        return counts


def descriptions(rng: random.Random, reject_share: float) -> str:
    """A slide-deck description; the stand-in checking AI rejects those saying 'forbidden'."""
    topic = rng.choice(["quarterly results", "team offsite", "product launch", "thesis defence"])
    return f"forbidden {topic}" if rng.random() < reject_share else f"slides about the {topic}"


def send_requests(producer: KeyedProducer, topics: events.Topics, run_id: str, count: int,
                  rate: float | None = None, reject_share: float = 0.0, seed: int = 7,
                  progress: bool = True) -> SourceReport:
    """Send `count` requests, as fast as possible or at `rate` per second; wait for every ack."""
    rng = random.Random(seed)
    ids: list[str] = []
    futures: list[Future] = []
    started = time.monotonic()
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("sending requests", total=count)
        for i in range(count):
            if rate:
                delay = started + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            intake = events.intake_event(run_id, f"user-{rng.randrange(10_000)}", f"upload/{i}.png")
            producer.send(topics.intake, intake)
            style = events.style_event(run_id, intake["request_id"], rng.choice(events.STYLES),
                                       descriptions(rng, reject_share))
            futures.append(producer.send(topics.style, style))
            ids.append(intake["request_id"])
            bar.advance(task)
        producer.flush(60)
    partitions = [f.result(60)[0] for f in futures]
    return SourceReport(ids, partitions, time.monotonic() - started)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefix", required=True)
    p.add_argument("--run-id", required=True)
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--burst", type=int, help="send N requests as fast as possible")
    load.add_argument("--rate", type=float, help="requests per second (with --duration)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds, with --rate")
    p.add_argument("--keys", default="uuid", help="uuid | none | field:<name>")
    p.add_argument("--profile", default="durability")
    p.add_argument("--reject-share", type=float, default=0.0, help="share of requests the check rejects")
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    args = p.parse_args()
    count = args.burst if args.burst else round(args.rate * args.duration)
    producer = KeyedProducer(args.bootstrap_servers, profile=args.profile, key_strategy=args.keys)
    try:
        report = send_requests(producer, events.Topics(args.prefix), args.run_id, count,
                               rate=args.rate, reject_share=args.reject_share)
    finally:
        producer.close()
    print(f"sent {len(report.request_ids)} requests in {report.seconds:.2f}s "
          f"to {len(set(report.style_partitions))} partition(s)")


if __name__ == "__main__":
    main()
