"""The faults of `make faults`, each injected and undone by the harness itself.

Every fault is a `Fault` of its own kind. Its `inject` blocks for as long as it lasts and undoes
it in a `finally` (a frozen broker is thawed, a killed one restarted, PostgreSQL started, the AI
service healed) even when the run is interrupted, and returns when it was in force: the
figures measure recovery from its end.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from bench import fault_pipeline
from bench.fault_figures import Poison
from bench.fault_fleets import SupervisedFleets
from bench.fault_record import Injection, PhaseRecord
from consumers.config import events, pipeline_spec
from consumers.config.candidate import PipelineConfig
from consumers.config.kafka_connection import KafkaConnection
from consumers.kafka_clients.producer import KeyedProducer
from infra import kafka_cluster, postgres_server
from infra.layout import Layout
from infra.stack import StackState, restart_broker

BROKER_DOWN_S = 30.0
BROKER_FROZEN_S = 20.0
POSTGRES_DOWN_S = 15.0
AI_ERROR_RATE = 0.10
AI_HANG_RATE = 0.05
AI_BURSTS = 3  # 429 bursts: the rate limit on for AI_BURST_S, then off for AI_BURST_GAP_S
AI_BURST_S = 3.0
AI_BURST_GAP_S = 7.0
AI_BURST_RATE_SHARE = 0.25  # rate limit during a burst, as a share of the load
AI_OUTAGE_S = 60.0  # wall seconds, whatever the time scale: an outage as a user lives it
OUTAGE_ENDPOINT = "generate"
OUTAGE_MAX_RECOVERY_S = 10.0  # back to 90 % of the pre-fault rate after the endpoint answers
WORK_RAISES_S = 60.0  # of load between the pre- and post-fault seconds: about 20 raising records
# Over the producer's default message.max.bytes (1,000,000), under the broker's and the topics'
# default (1,048,588) with room for the batch framing.
OVERSIZE_BYTES = 1_010_000
OVERSIZE_PRODUCER_MAX_BYTES = 1_048_576


@dataclass
class Target:
    """What a fault acts on: the stack, the phase's run, its fleets and the AI service."""

    layout: Layout
    kafka: KafkaConnection  # the admin's: no role may write every input topic, as the oversize fault does
    ai_url: str
    run_id: str
    config: PipelineConfig
    fleets: SupervisedFleets
    load_rps: float
    say: Callable[[str], None]  # progress line

    @property
    def topics(self) -> events.Topics:
        return events.Topics(self.run_id, self.config.spec)

    def wait(self, seconds: float, what: str) -> None:
        """Sleep out part of a fault with a countdown."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.say(f"{what}: {left:.0f} s left")
            time.sleep(min(1.0, left))


def partition_leaders(kafka: KafkaConnection, topics: list[str]) -> dict[tuple[str, int], int]:
    """The leader broker of every partition of `topics`."""
    meta = kafka.admin().list_topics(timeout=10)
    return {(topic, pid): partition.leader for topic in topics
            for pid, partition in meta.topics[topic].partitions.items()}


def busiest_leader(leaders: Mapping[Any, int]) -> tuple[int, int]:
    """(broker leading the most partitions, how many); the lowest id among equals."""
    counts = Counter(leaders.values())
    node = min(counts, key=lambda n: (-counts[n], n))
    return node, counts[node]


def _busiest_broker(t: Target) -> tuple[int, int, int]:
    node, led = busiest_leader(partition_leaders(t.kafka, t.topics.all()))
    return node, led, StackState.load(t.layout).kafka[node]


def in_flight_window(config: PipelineConfig, stage: str) -> int:
    """AI calls a stage's fleet can have under way at once: what a kill -9 may leave answered
    but unrecorded, so called again after the restart."""
    return config.stage(stage).ai_calls_at_once


def configure_ai(ai_url: str, changes: dict[str, Any]) -> None:
    """Change both AI endpoints at run time."""
    requests.put(f"{ai_url}/v1/config", json=changes, timeout=10).raise_for_status()


def hang_s(config: PipelineConfig, stages: tuple[str, ...]) -> float:
    """A hang past the client's timeout of `stages` (real-scale seconds, as the stand-in takes
    them): the slot stays taken for twice that timeout, as a stuck upstream's would."""
    return 2 * max(config.ai_timeout(s) for s in stages) / config.time_scale


def oversize_records(run_id: str, topics: events.Topics) -> list[tuple[str, bytes]]:
    """One well-formed event of exactly OVERSIZE_BYTES per stage input topic (the padding in a
    free-text field), as a misbehaving upstream with a raised size limit would send."""
    spec = topics.spec
    generator = pipeline_spec.resolve(spec.load.generator)
    generated = [event for _, event in generator(random.Random(), run_id, 0, 0.0)]
    records = []
    for stage in spec.stages:
        event = next(e for e in generated if not list(spec.validators[stage].iter_errors(e)))
        padded = spec.stages[stage].free_text_field(spec.key)
        event = {**event, padded: ""}
        event[padded] = "x" * (OVERSIZE_BYTES - len(events.encode(event)))
        records.append((topics.source_of(stage), events.encode(event)))
    return records


@dataclass(frozen=True, kw_only=True)
class Fault(ABC):
    """A fault of the run: what it does (`inject`), how long it is planned to be in force (which
    sizes the load), and what the pipeline is allowed under it."""

    name: str
    summary: str
    planned_s: float
    allowed_dead_letters: Mapping[str, int | None] = field(default_factory=dict)  # None: any
    max_recovery_s: float | None = None  # bound on the recovery figure (None: none)
    fleets_stay_up: bool = False  # a fleet process that exits fails the phase
    pipeline: str = pipeline_spec.REFERENCE  # the spec the phase runs
    poison: Poison | None = None  # requests that pipeline fails by design

    @abstractmethod
    def inject(self, t: Target) -> Injection:
        """The fault in force, then undone; when it was."""

    def allowed_service_duplicates(self, config: PipelineConfig) -> int:
        """AI calls the service may serve twice because of the fault itself."""
        return 0

    def closing_note(self, phase: PhaseRecord) -> str | None:
        """A line for the end of the run's output, when the phase's table column needs one."""
        return None

    def record(self, run_id: str, config: PipelineConfig) -> PhaseRecord:
        """The phase's record before it runs: the bounds this fault sets on it."""
        return PhaseRecord(self.name, self.summary, dict(self.allowed_dead_letters), self.max_recovery_s,
                           self.fleets_stay_up, self.pipeline, run_id,
                           self.allowed_service_duplicates(config), config.exactly_once)


@dataclass(frozen=True, kw_only=True)
class BrokerKill(Fault):
    """kill -9 the broker leading most of the run's partitions; start it again after 30 s. The
    fault ends when the harness starts it: its start-up and catching up are the recovery."""

    def inject(self, t: Target) -> Injection:
        node, led, pid = _busiest_broker(t)
        os.kill(pid, signal.SIGKILL)
        start = time.time()
        try:
            t.wait(BROKER_DOWN_S, f"broker {node} (leader of {led} partitions) killed")
        finally:
            state = restart_broker(t.layout, node)
        end = time.time()
        t.say(f"broker {node} restarted; waiting until it is registered")
        kafka_cluster.wait_registered(t.layout, state.kafka, state.brokers)
        return Injection(start, end, {"broker": node, "partitions_led": led, "pid": pid,
                                   "registered_after_s": round(time.time() - end, 1)})


@dataclass(frozen=True, kw_only=True)
class BrokerFreeze(Fault):
    """SIGSTOP the broker leading most of the run's partitions for 20 s, then SIGCONT: alive to
    the operating system, silent to the cluster (a long GC pause, a stalled VM)."""

    def inject(self, t: Target) -> Injection:
        node, led, pid = _busiest_broker(t)
        os.kill(pid, signal.SIGSTOP)
        start = time.time()
        try:
            t.wait(BROKER_FROZEN_S, f"broker {node} (leader of {led} partitions) frozen")
        finally:
            os.kill(pid, signal.SIGCONT)
        return Injection(start, time.time(), {"broker": node, "partitions_led": led, "pid": pid})


@dataclass(frozen=True, kw_only=True)
class FleetKill(Fault):
    """kill -9 of a stage's fleet process, which supervisord restarts. The calls it had under
    way may be served twice (the service's count is bounded by its in-flight window), and the
    platform's count of duplicate calls must be the service's: a try counts once it is sent."""

    stage: str

    def inject(self, t: Target) -> Injection:
        """The fault is the kill itself: supervisord's restart and the group's rebalance (the
        dead members expire first) are the recovery, whose steps are timed in the detail."""
        pid = t.fleets.kill(self.stage, signal.SIGKILL)
        start = time.time()
        t.say(f"{self.stage} fleet (pid {pid}) killed; supervisord restarts it")
        while t.fleets.pid(self.stage) in (0, pid):
            if time.time() - start > 60:
                raise TimeoutError(f"supervisord did not restart the {self.stage} fleet: see "
                                   f"{t.fleets.log_file(self.stage)}")
            time.sleep(0.2)
        restarted = time.time()
        t.say(f"{self.stage} fleet restarted; waiting for its group to settle")
        settled = t.fleets.wait_stable((self.stage,), since=start)
        return Injection(start, start, {"killed_pid": pid, "new_pid": t.fleets.pid(self.stage),
                                     "restarted_after_s": round(restarted - start, 1),
                                     "group_settled_after_s": round(settled - start, 1),
                                     "in_flight_window": in_flight_window(t.config, self.stage)})

    def allowed_service_duplicates(self, config: PipelineConfig) -> int:
        return in_flight_window(config, self.stage)

    def closing_note(self, phase: PhaseRecord) -> str:
        """The in-flight window beside what was served twice: the figures the kill is about."""
        f = phase.figures
        return (f"{phase.fault}: in-flight window {phase.allowed_service_duplicates} calls (the most the "
                f"service may serve twice); served twice: {f.service_duplicates if f else '-'}, by our rows: "
                f"{f.duplicate_ai_calls if f else '-'}; output events seen twice (read_committed): "
                f"{f.duplicate_outputs if f else '-'}")


def fleet_kill(stage: str) -> FleetKill:
    return FleetKill(name=f"fleet-kill-{stage}", planned_s=0.0, stage=stage,
                     summary=f"kill -9 of the {stage} fleet; supervisord restarts it")


@dataclass(frozen=True, kw_only=True)
class PostgresStop(Fault):
    """PostgreSQL stopped (fast shutdown: sessions cut) for 15 s, then started."""

    def inject(self, t: Target) -> Injection:
        postgres_server.stop(t.layout)
        start = time.time()
        try:
            t.wait(POSTGRES_DOWN_S, "PostgreSQL stopped")
        finally:
            t.say("starting PostgreSQL")
            postgres_server.start(t.layout)
        return Injection(start, time.time())


@dataclass(frozen=True, kw_only=True)
class DegradedAI(Fault):
    """10 % 500s, 5 % hangs past the client's timeout and three 429 bursts (a request-rate
    limit at a quarter of the load for 3 s of every 10), on both AI endpoints."""

    def inject(self, t: Target) -> Injection:
        hang = hang_s(t.config, t.config.spec.ai_stages)
        burst_rate = AI_BURST_RATE_SHARE * t.load_rps * t.config.time_scale  # real-scale requests/s
        configure_ai(t.ai_url, {"error_rate": AI_ERROR_RATE, "hang_rate": AI_HANG_RATE, "hang_s": hang})
        start = time.time()
        try:
            for burst in range(1, AI_BURSTS + 1):
                what = f"AI: 10% 5xx, 5% hangs, 429 burst {burst}/{AI_BURSTS}"
                configure_ai(t.ai_url, {"rate_limit_rps": burst_rate, "rate_burst": 1})
                t.wait(AI_BURST_S, what)
                configure_ai(t.ai_url, {"rate_limit_rps": None})
                t.wait(AI_BURST_GAP_S, f"AI: 10% 5xx, 5% hangs, after burst {burst}/{AI_BURSTS}")
        finally:
            configure_ai(t.ai_url, {"error_rate": 0.0, "hang_rate": 0.0, "rate_limit_rps": None})
        return Injection(start, time.time(), {"hang_s": hang, "burst_rate_rps": burst_rate})


@dataclass(frozen=True, kw_only=True)
class Outage(Fault, ABC):
    """The generate endpoint failing every call for AI_OUTAGE_S, then healed; the check
    endpoint serves on."""

    @abstractmethod
    def failing(self, config: PipelineConfig) -> tuple[dict[str, Any], str]:
        """The endpoint's settings while it fails, and what it does then."""

    def inject(self, t: Target) -> Injection:
        failing, what = self.failing(t.config)
        configure_ai(t.ai_url, {OUTAGE_ENDPOINT: failing})
        start = time.time()
        try:
            t.wait(AI_OUTAGE_S, f"AI outage: {OUTAGE_ENDPOINT} {what}")
        finally:
            configure_ai(t.ai_url, {OUTAGE_ENDPOINT: {"error_rate": 0.0, "hang_rate": 0.0}})
        return Injection(start, time.time(), {"endpoint": OUTAGE_ENDPOINT, **failing})


@dataclass(frozen=True, kw_only=True)
class OutageErrors(Outage):
    """Every call to the generate endpoint answered 500 (after its latency) for 60 s."""

    def failing(self, config: PipelineConfig) -> tuple[dict[str, Any], str]:
        return {"error_rate": 1.0}, "answers 500 to every call"


@dataclass(frozen=True, kw_only=True)
class OutageHangs(Outage):
    """Every call to the generate endpoint hanging past the client's timeout for 60 s."""

    def failing(self, config: PipelineConfig) -> tuple[dict[str, Any], str]:
        return {"hang_rate": 1.0, "hang_s": hang_s(config, (OUTAGE_ENDPOINT,))}, "hangs on every call"


@dataclass(frozen=True, kw_only=True)
class Oversize(Fault):
    """One record over the producer's size limit (under the broker's) on each input topic."""

    def inject(self, t: Target) -> Injection:
        producer = KeyedProducer(t.kafka, profile=t.config.profile, **{
            "message.max.bytes": OVERSIZE_PRODUCER_MAX_BYTES, "compression.type": "none"})
        start = time.time()
        sent = []
        try:
            for topic, value in oversize_records(t.run_id, t.topics):
                partition, offset = producer.send(topic, value=value, key=uuid.uuid4().bytes).result(60)
                sent.append((topic, partition, offset))
        finally:
            producer.close()
        return Injection(start, time.time(), {"bytes": OVERSIZE_BYTES}, tuple(sent))


@dataclass(frozen=True, kw_only=True)
class WorkRaises(Fault):
    """Nothing to inject: the phase's pipeline (bench.fault_pipeline) raises on 1 % of the
    requests for the whole load. It is in force for WORK_RAISES_S of it between the pre- and
    post-fault seconds, as long as an outage's: about 20 raising requests per run."""

    def inject(self, t: Target) -> Injection:
        start = time.time()
        t.wait(WORK_RAISES_S, f"{fault_pipeline.STAGE} raising on 1 % of the requests")
        return Injection(start, time.time(), {"stage": fault_pipeline.STAGE,
                                           "raising_per": fault_pipeline.RAISING_PER})


FAULTS: tuple[Fault, ...] = (
    BrokerKill(name="broker-kill", summary="kill -9 of the busiest leader, restarted after 30 s",
               planned_s=BROKER_DOWN_S),
    BrokerFreeze(name="broker-freeze", summary="SIGSTOP of the busiest leader for 20 s, then SIGCONT",
                 planned_s=BROKER_FROZEN_S),
    fleet_kill("check"),
    fleet_kill("generate"),
    PostgresStop(name="postgres-stop", summary="PostgreSQL stopped for 15 s", planned_s=POSTGRES_DOWN_S + 3),
    DegradedAI(name="ai-faults", summary="AI: 10% 5xx, 5% hangs past the timeout, 429 bursts",
               planned_s=AI_BURSTS * (AI_BURST_S + AI_BURST_GAP_S),
               allowed_dead_letters={"ai_unavailable": None}),
    Oversize(name="oversize", summary=f"one {OVERSIZE_BYTES:,}-byte record on each input topic",
             planned_s=0.0, allowed_dead_letters={"oversize": 3}),
    OutageErrors(name="ai-outage", summary=f"AI: {OUTAGE_ENDPOINT} answers 500 to every call for "
                 f"{AI_OUTAGE_S:.0f} s", planned_s=AI_OUTAGE_S, max_recovery_s=OUTAGE_MAX_RECOVERY_S,
                 fleets_stay_up=True),
    OutageHangs(name="ai-outage-timeouts", summary=f"AI: every {OUTAGE_ENDPOINT} call hangs past the timeout "
                f"for {AI_OUTAGE_S:.0f} s", planned_s=AI_OUTAGE_S, max_recovery_s=OUTAGE_MAX_RECOVERY_S,
                fleets_stay_up=True),
    WorkRaises(name="work-raises", summary=f"a Python stage raising on 1 in {fault_pipeline.RAISING_PER} "
               "requests", planned_s=WORK_RAISES_S, allowed_dead_letters={"work_failed": None},
               fleets_stay_up=True, pipeline=fault_pipeline.NAME,
               poison=Poison(fault_pipeline.raises, fault_pipeline.dead_letter_reason)),
)
