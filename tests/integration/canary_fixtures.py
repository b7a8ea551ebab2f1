"""A live support_tickets deployment under the stack's supervisord and a steady load on it: what a
canary needs to run beside, for the canary DAG's tests and the UI's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from consumers.config import events
from consumers.config.candidate import Endpoints, PipelineConfig, StageConfig
from consumers.kafka_clients import provisioning
from consumers.kafka_clients.producer import KeyedProducer
from consumers.loadgen.source import send_requests
from consumers.runs.pipeline_run import provision_pipeline
from pipeline_ops.fleets import FleetEnvironment, FleetSupervisor
from pipeline_ops.operators.runs import fit_stand_in
from pipeline_ops.registry import ConfigRegistry
from tests.integration.kafka_helpers import wait_committed_to_end
from tests.integration.pipeline_fixtures import query
from tests.stack import Stack, unique

PIPELINE = "support_tickets"
CONFIG = PipelineConfig(pipeline=PIPELINE, partitions=4, replication_factor=1, time_scale=0.05,
                        shutdown_deadline_s=5,
                        stages={"triage": StageConfig("flow", members=1, window=8),
                                "draft": StageConfig("flow", members=1, window=8)})
RATE = 25.0  # tickets a second while a canary runs
# The candidate both modules try as the one to roll back: the draft stage on the next, slower
# and dearer model (the stand-in serves it 1.3 times slower at 1.5 times the price).
SLOWER = {"draft": {"work": {"endpoint": "large_model_next"}}}


@dataclass(frozen=True)
class Live:
    run_id: str
    version: int
    topics: events.Topics


@contextmanager
def live_deployment(stack: Stack) -> Iterator[Live]:
    """support_tickets deployed under the stack's supervisord, its version the active one. The
    caller holds the stack's AI stand-in: it is fitted to the deployment here."""
    run_id = unique("canary-live")
    topics = events.Topics(run_id, CONFIG.spec)
    provision_pipeline(CONFIG, topics, stack.kafka)
    fit_stand_in(CONFIG, 16)
    registry = ConfigRegistry()
    version = registry.register("canary-live", CONFIG, note="the canary tests' live deployment")
    registry.activate(version, "promote", run_id)
    fleets = FleetSupervisor()
    env = FleetEnvironment(stack.kafka, stack.database_url,
                           Endpoints.on(stack.env["AI_SERVICE_URL"], CONFIG.spec).urls)
    try:
        fleets.start(run_id, version, CONFIG, env, ready_timeout_s=120)
        yield Live(run_id, version, topics)
    finally:
        fleets.stop(run_id)
        provisioning.delete(stack.connection, topics.all())


@contextmanager
def steady_load(stack: Stack, live: Live) -> Iterator[list[str]]:
    """RATE tickets a second on the live topics until the block ends; the ids sent."""
    sent: list[str] = []
    stop = threading.Event()

    def send() -> None:
        producer = KeyedProducer(stack.connection, key_strategy="uuid")
        while not stop.is_set():
            sent.extend(send_requests(producer, live.topics, live.run_id, int(RATE), rate=RATE,
                                      seed=len(sent), progress=False).request_ids)
        producer.close()

    thread = threading.Thread(target=send, name="steady-load")
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join()


def canary_of(stack: Stack, live: Live) -> tuple[int, str, list[tuple]]:
    """The latest canary on the live deployment: its id, state and (step, verdict) rows."""
    canary, state = query(stack.database_url, "SELECT id, state FROM canaries WHERE run_id = %s "
                          "ORDER BY id DESC LIMIT 1", live.run_id)[0]
    steps = query(stack.database_url, "SELECT step, verdict FROM canary_steps WHERE canary_id = %s "
                  "ORDER BY step", canary)
    return canary, state, steps


def why_of(stack: Stack, canary: int) -> str:
    """What a canary ended on and each step's checks that did not pass, for a failing assertion."""
    reason = query(stack.database_url, "SELECT reason FROM canaries WHERE id = %s", canary)[0][0]
    lines = [f"canary {canary}: {reason}"]
    for step, decision, figures in query(stack.database_url, "SELECT step, decision, figures FROM "
                                         "canary_steps WHERE canary_id = %s ORDER BY step", canary):
        checks = [f"{c['name']} {c['outcome']}: {c['note']} (measured {c['measured']}, baseline "
                  f"{c['baseline']}, p {c['p_value']})" for c in figures.get("checks", [])
                  if c["outcome"] != "pass"]
        lines.append(f"step {step} ({decision}): " + ("; ".join(checks) or figures.get("reason", "")))
    return "\n".join(lines)


def active_of(stack: Stack) -> list[tuple]:
    return query(stack.database_url, "SELECT version FROM configurations WHERE active AND pipeline = %s",
                 PIPELINE)


def all_handled(stack: Stack, live: Live, sent: list[str]) -> None:
    """Every ticket sent was settled and both AI stages' groups committed to the end."""
    left = wait_committed_to_end(stack.connection, {live.topics.source_of(s): live.topics.group_of(s)
                                                    for s in ("triage", "draft")}, 120)
    assert all(n == 0 for _, n in left.values()), left
    settled = query(stack.database_url, "SELECT count(*) FROM requests WHERE run_id = %s AND status IN "
                    "('completed', 'rejected', 'dead_lettered')", live.run_id)[0][0]
    assert settled >= len(sent)
