"""The canary DAG from its form to its decision, against the real stack: a live deployment of
support_tickets under supervisord takes a steady load while `pipeline_canary` runs; a slower,
dearer draft model is rolled back by itself at its first step, an identical candidate is
promoted through every step, and every ticket is handled."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

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

# The fleets call the stack's AI stand-in, which DAG runs reconfigure: alone on it for the module.
pytestmark = [pytest.mark.usefixtures("stand_in_for_module"), pytest.mark.timeout(1500)]

PIPELINE = "support_tickets"
CONFIG = PipelineConfig(pipeline=PIPELINE, partitions=4, replication_factor=1, time_scale=0.05,
                        shutdown_deadline_s=5,
                        stages={"triage": StageConfig("flow", members=1, window=8),
                                "draft": StageConfig("flow", members=1, window=8)})
RATE = 25.0  # tickets a second while a canary runs
FORM = {"pipeline": PIPELINE, "candidate": "active", "steps": [0.25, 1.0], "window_s": 8}


@dataclass(frozen=True)
class Live:
    run_id: str
    version: int
    topics: events.Topics


@pytest.fixture(scope="module")
def live(stack: Stack) -> Iterator[Live]:
    """support_tickets deployed under the stack's supervisord, its version the active one."""
    run_id = unique("canary-live")
    topics = events.Topics(run_id, CONFIG.spec)
    provision_pipeline(CONFIG, topics, stack.kafka)
    fit_stand_in(CONFIG, 16)
    registry = ConfigRegistry()
    version = registry.register("canary-live", CONFIG, note="test_canary_dag")
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


def all_handled(stack: Stack, live: Live, sent: list[str]) -> None:
    left = wait_committed_to_end(stack.connection, {live.topics.source_of(s): live.topics.group_of(s)
                                                    for s in ("triage", "draft")}, 120)
    assert all(n == 0 for _, n in left.values()), left
    settled = query(stack.database_url, "SELECT count(*) FROM requests WHERE run_id = %s AND status IN "
                    "('completed', 'rejected', 'dead_lettered')", live.run_id)[0][0]
    assert settled >= len(sent)


def test_a_slower_dearer_model_is_rolled_back_at_its_first_step(stack: Stack, live: Live) -> None:
    form = {**FORM, "run_id": live.run_id, "overrides": {"draft": {"work": {"endpoint": "large_model_next"}}}}
    with steady_load(stack, live) as sent:
        run = stack.run_dag("pipeline_canary", conf=json.dumps(form))
    assert run.state == "success", run.output[-6000:]
    _, state, steps = canary_of(stack, live)
    assert (state, steps) == ("rolled_back", [(1, "fail")])
    active = query(stack.database_url, "SELECT version FROM configurations WHERE active AND pipeline = %s",
                   PIPELINE)
    assert active == [(live.version,)]
    all_handled(stack, live, sent)


def test_an_identical_candidate_is_promoted_through_every_step(stack: Stack, live: Live) -> None:
    with steady_load(stack, live) as sent:
        run = stack.run_dag("pipeline_canary", conf=json.dumps({**FORM, "run_id": live.run_id}))
    assert run.state == "success", run.output[-6000:]
    canary, state, steps = canary_of(stack, live)
    assert (state, steps) == ("promoted", [(1, "pass")])
    # nothing to restart (the candidate configures every stage as the live fleets run it); the
    # canary's fleets stopped, one per AI stage (an identical candidate canaries them all)
    def states(deployment: str) -> list[tuple[str, str]]:
        return query(stack.database_url, "SELECT stage, state FROM deployments WHERE run_id = %s "
                     "ORDER BY stage, id", deployment)

    assert states(live.run_id) == [("draft", "running"), ("triage", "running")]
    assert states(f"{live.run_id}.canary-{canary}") == [("draft", "stopped"), ("triage", "stopped")]
    all_handled(stack, live, sent)
