"""The event source: requests of the reference scenario, as a burst or at a steady rate.

    python -m consumers.source --prefix demo --run-id r1 --burst 1280
    python -m consumers.source --prefix demo --run-id r1 --rate 20 --duration 60 --keys none

Each request is an upload notification on `<prefix>.intake` followed by the user's style
choice on `<prefix>.style` (the AI stages' input). Every send is acknowledged before the
source reports success; a delivery failure stops it with the error.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass

from rich.console import Console
from rich.progress import Progress

from consumers import events, kafka_connection
from consumers.kafka_connection import KafkaConnection
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


def _request(rng: random.Random, run_id: str, i: int, reject_share: float) -> tuple[dict, dict]:
    """One request: the upload notification and the user's style choice for it."""
    intake = events.intake_event(run_id, f"user-{rng.randrange(10_000)}", f"upload/{i}.png")
    style = events.style_event(run_id, intake["request_id"], rng.choice(events.STYLES),
                               descriptions(rng, reject_share))
    return intake, style


def send_requests(producer: KeyedProducer, topics: events.Topics, run_id: str, count: int,
                  rate: float | None = None, reject_share: float = 0.0, seed: int = 7,
                  progress: bool = True) -> SourceReport:
    """Send `count` requests, as a burst or at `rate` per second; wait for every ack.

    A burst is built first and then sent back to back (all uploads, then all style choices),
    so its send rate is the client's, not the event builder's: that is what puts a keyless
    burst into few sticky-partitioning windows.
    """
    rng = random.Random(seed)
    futures: list[Future] = []
    started = time.monotonic()
    with Progress(disable=not progress, transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("sending requests", total=count)
        if rate:
            requests = []
            for i in range(count):
                delay = started + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                requests.append(_request(rng, run_id, i, reject_share))
                producer.send(topics.intake, requests[-1][0])
                futures.append(producer.send(topics.style, requests[-1][1]))
                bar.advance(task)
        else:
            requests = [_request(rng, run_id, i, reject_share) for i in range(count)]
            for intake, _ in requests:
                producer.send(topics.intake, intake)
            futures = [producer.send(topics.style, style) for _, style in requests]
            bar.update(task, completed=count)
        producer.flush(60)
    partitions = [f.result(60)[0] for f in futures]
    return SourceReport([intake["request_id"] for intake, _ in requests], partitions,
                        time.monotonic() - started)


def _send_with_own_producer(kafka: KafkaConnection, profile: str, key_strategy: str, topics: events.Topics,
                            run_id: str, count: int, rate: float | None, reject_share: float,
                            progress: bool) -> SourceReport:
    producer = KeyedProducer(kafka, profile=profile, key_strategy=key_strategy)
    try:
        producer.prepare([topics.intake, topics.style])
        return send_requests(producer, topics, run_id, count, rate=rate, reject_share=reject_share,
                             progress=progress)
    finally:
        producer.close()


def send_in_process(kafka: KafkaConnection, profile: str, key_strategy: str, topics: events.Topics,
                    run_id: str, count: int, rate: float | None = None, reject_share: float = 0.0,
                    progress: bool = False) -> SourceReport:
    """`send_requests` from a process of its own (this module's command), as the backend it
    stands for would send.

    Sharing the interpreter with a fleet's consumer threads slows the send loop down, and the
    send rate decides how many sticky-partitioning windows a keyless burst spans. A plain
    command rather than multiprocessing: it works the same under any parent (an Airflow task
    runner's main module cannot be re-imported by a spawned child).
    """
    load = ["--rate", str(rate), "--duration", str(count / rate)] if rate else ["--burst", str(count)]
    cmd = [sys.executable, "-m", "consumers.source", "--prefix", topics.prefix, "--run-id", run_id,
           *load, "--keys", key_strategy, "--profile", profile, "--reject-share", str(reject_share),
           "--json", *([] if progress else ["--quiet"])]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False,
                          env=kafka.child_environment())
    if done.returncode != 0:
        raise RuntimeError(f"the load source failed with exit code {done.returncode} (its error is above)")
    return SourceReport(**json.loads(done.stdout))


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
    kafka_connection.add_argument(p)
    p.add_argument("--json", action="store_true", help="print the report (request ids, partitions) as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args()
    count = args.burst if args.burst else round(args.rate * args.duration)
    kafka = kafka_connection.from_args(args, p).of("source")
    report = _send_with_own_producer(kafka, args.profile, args.keys, events.Topics(args.prefix),
                                     args.run_id, count, args.rate, args.reject_share,
                                     progress=not args.quiet)
    if args.json:
        print(json.dumps(asdict(report)))
        return
    print(f"sent {len(report.request_ids)} requests in {report.seconds:.2f}s "
          f"to {len(set(report.style_partitions))} partition(s)")


if __name__ == "__main__":
    main()
