"""The event source: a pipeline's requests, as a burst or at a steady rate.

    python -m consumers.loadgen.source --prefix demo --run-id r1 --burst 1280
    python -m consumers.loadgen.source --pipeline text_moderation --prefix t1 --run-id t1 \
        --rate 20 --duration 60

The pipeline spec's load generator builds each request's events (for the reference pipeline:
an upload notification on `<prefix>.intake`, then the user's style choice on `<prefix>.style`).
Every send, on every topic, is acknowledged before the source reports success; a record it
could not deliver (refused, or still queued when its flush gives up) fails it with the error,
so that a loss of the source's own never passes for the pipeline's.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass

from rich.console import Console
from rich.progress import Progress

from consumers.config import events, kafka_connection, pipeline_spec
from consumers.config.kafka_connection import KafkaConnection
from consumers.kafka_clients.producer import DeliveryError, KeyedProducer
from consumers.runtime import start_up_heap

FLUSH_TIMEOUT_S = 60.0
SEED = 7  # of the load's random choices: every run sends the same sequence of requests


@dataclass(frozen=True)
class Waiting:
    """A share of the requests whose senders may wait `within_s` seconds (real scale) for the
    answer: each of the spec's deadline fields is set to it on their first event. Which ones is
    fixed by their index, evenly spread (of 0.7: 7 in every 10), so a run without it sends the
    same requests and its figures can be read for the same ones."""

    share: float
    within_s: float

    def waits(self, index: int) -> bool:
        return math.floor((index + 1) * self.share) > math.floor(index * self.share)

    def apply(self, index: int, fields: list[str], request: list[tuple[str, dict]]) -> None:
        if request and self.waits(index):
            request[0][1].update(dict.fromkeys(fields, self.within_s))


@dataclass
class SourceReport:
    """What was sent: request keys in order and the partition each event on the spec's measured
    topic landed on (the AI stages' input: its spread is the load's skew)."""

    request_ids: list[str]
    partitions_measured: list[int]
    seconds: float

    def per_partition(self, partitions: int) -> list[int]:
        counts = [0] * partitions
        for p in self.partitions_measured:
            counts[p] += 1
        return counts


def send_requests(producer: KeyedProducer, topics: events.Topics, run_id: str, count: int,
                  rate: float | None = None, reject_share: float = 0.0, seed: int = SEED,
                  progress: bool = True, waiting: Waiting | None = None) -> SourceReport:
    """Send `count` requests, as a burst or at `rate` per second; wait for every ack.

    A burst is built first and then sent back to back, each request's first events before any
    second ones (all uploads, then all style choices), so its send rate is the client's, not the
    event builder's: that is what puts a keyless burst into few sticky-partitioning windows.
    """
    spec = topics.spec
    resolved = pipeline_spec.resolve(spec.load.generator)
    rng = random.Random(seed)
    fields = sorted({s.deadline.event_field for s in spec.stages.values()
                     if s.deadline is not None and s.deadline.event_field})
    sent: list[tuple[str, Future]] = []

    def generator(rng: random.Random, run_id: str, index: int, reject_share: float) -> list[tuple[str, dict]]:
        request = resolved(rng, run_id, index, reject_share)
        if waiting is not None:
            waiting.apply(index, fields, request)
        return request

    def send(topic: str, event: dict) -> None:
        sent.append((topic, producer.send(topics.name(topic), event)))

    started = time.monotonic()
    with Progress(disable=not progress, transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("sending requests", total=count)
        requests: list[list[tuple[str, dict]]] = []
        if rate:
            for i in range(count):
                delay = started + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                requests.append(generator(rng, run_id, i, reject_share))
                for topic, event in requests[-1]:
                    send(topic, event)
                bar.advance(task)
        else:
            requests = [generator(rng, run_id, i, reject_share) for i in range(count)]
            for position in range(max(map(len, requests), default=0)):
                for request in requests:
                    if position < len(request):
                        send(*request[position])
            bar.update(task, completed=count)
        _check_delivered([future for _, future in sent], producer.flush(FLUSH_TIMEOUT_S))
    partitions = [future.result()[0] for topic, future in sent if topic == spec.load.measure]
    return SourceReport([request[0][1][spec.key] for request in requests], partitions,
                        time.monotonic() - started)


def _check_delivered(futures: list[Future], undelivered: int) -> None:
    """Raise unless every send was acknowledged: `undelivered` records were still queued when
    the flush gave up, and a future that resolved to an error is a record the broker refused.
    (Once the flush has emptied the queue, every future is resolved or about to be: its
    delivery callback may still be running on the producer's poll thread.)"""
    if undelivered:
        raise DeliveryError(f"{undelivered} of {len(futures)} records still undelivered after "
                            f"{FLUSH_TIMEOUT_S:g} s: the load source lost them")
    failures = [error for error in (future.exception(FLUSH_TIMEOUT_S) for future in futures) if error]
    if failures:
        raise DeliveryError(f"{len(failures)} of {len(futures)} records not delivered by the load "
                            f"source; the first: {failures[0]}") from failures[0]


def _send_with_own_producer(kafka: KafkaConnection, profile: str, key_strategy: str, topics: events.Topics,
                            run_id: str, count: int, rate: float | None, reject_share: float,
                            progress: bool, batch_records: int | None,
                            waiting: Waiting | None = None) -> SourceReport:
    producer = KeyedProducer(kafka, profile=profile, key_strategy=key_strategy, batch_records=batch_records)
    try:
        producer.prepare(topics.producing())
        return send_requests(producer, topics, run_id, count, rate=rate, reject_share=reject_share,
                             progress=progress, waiting=waiting)
    finally:
        producer.close()


def send_in_process(kafka: KafkaConnection, profile: str, key_strategy: str, topics: events.Topics,
                    run_id: str, count: int, rate: float | None = None, reject_share: float = 0.0,
                    progress: bool = False, batch_records: int | None = None,
                    waiting: Waiting | None = None) -> SourceReport:
    """`send_requests` from a process of its own (this module's command), as the backend it
    stands for would send; `batch_records` caps its producer's batches (PipelineConfig's
    producer_batch_records).

    Sharing the interpreter with a fleet's consumer threads slows the send loop down, and the
    send rate decides how many sticky-partitioning windows a keyless burst spans. A plain
    command rather than multiprocessing: it works the same under any parent (an Airflow task
    runner's main module cannot be re-imported by a spawned child).
    """
    load = ["--rate", str(rate), "--duration", str(count / rate)] if rate else ["--burst", str(count)]
    cmd = [sys.executable, "-m", "consumers.loadgen.source", "--pipeline", topics.spec.name,
           "--prefix", topics.prefix, "--run-id", run_id,
           *load, "--keys", key_strategy, "--profile", profile, "--reject-share", str(reject_share),
           *(["--batch-records", str(batch_records)] if batch_records else []),
           *(["--wait-share", str(waiting.share), "--wait-s", str(waiting.within_s)] if waiting else []),
           "--json", *([] if progress else ["--quiet"])]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False,
                          env=kafka.child_environment())
    if done.returncode != 0:
        raise RuntimeError(f"the load source failed with exit code {done.returncode} (its error is above)")
    return SourceReport(**json.loads(done.stdout))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeline", default=pipeline_spec.REFERENCE, help="a spec's name or path")
    p.add_argument("--prefix", required=True)
    p.add_argument("--run-id", required=True)
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--burst", type=int, help="send N requests as fast as possible")
    load.add_argument("--rate", type=float, help="requests per second (with --duration)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds, with --rate")
    p.add_argument("--keys", default="uuid", help="uuid | none | field:<name>")
    p.add_argument("--profile", default="durability")
    p.add_argument("--reject-share", type=float, default=0.0,
                   help="share of requests the pipeline's generator makes to be refused")
    p.add_argument("--batch-records", type=int,
                   help="most records a producer batch holds (the window of a share group it feeds)")
    p.add_argument("--wait-share", type=float, default=0.0,
                   help="share of requests whose senders may wait --wait-s for the answer (the spec's "
                        "deadline fields set)")
    p.add_argument("--wait-s", type=float, default=3600.0, help="seconds, real scale, with --wait-share")
    kafka_connection.add_argument(p)
    p.add_argument("--json", action="store_true", help="print the report (request ids, partitions) as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args()
    count = args.burst if args.burst else round(args.rate * args.duration)
    kafka = kafka_connection.from_args(args, p).of("source")
    topics = events.Topics(args.prefix, pipeline_spec.load(args.pipeline))
    start_up_heap.freeze()
    waiting = Waiting(args.wait_share, args.wait_s) if args.wait_share else None
    report = _send_with_own_producer(kafka, args.profile, args.keys, topics, args.run_id, count,
                                     args.rate, args.reject_share, progress=not args.quiet,
                                     batch_records=args.batch_records, waiting=waiting)
    if args.json:
        print(json.dumps(asdict(report)))
        return
    print(f"sent {len(report.request_ids)} requests in {report.seconds:.2f}s "
          f"to {len(set(report.partitions_measured))} partition(s) of {topics.spec.load.measure}")


if __name__ == "__main__":
    main()
