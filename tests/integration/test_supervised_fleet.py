"""Fleets under supervisord, against the running stack: nobody needs to act when a fleet dies.

Each test runs a supervisord of its own (in a temporary folder, so the stack's is untouched)
and real `python -m consumers.runtime.fleet` processes against the stack's Kafka and PostgreSQL.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest

from consumers.config import events
from consumers.config.candidate import Endpoints, PipelineConfig, StageConfig
from consumers.kafka_clients import provisioning
from consumers.runs.pipeline_run import provision_pipeline
from host import supervisor
from infra.layout import REPO
from pipeline_ops.fleets import FleetEnvironment, FleetSupervisor
from pipeline_ops.registry import ConfigRegistry
from tests.integration.pipeline_fixtures import query
from tests.stack import Stack, unique

# The fleets call the stack's AI stand-in, which DAG runs and the benchmark reconfigure: alone on it
# for the module.
pytestmark = [pytest.mark.usefixtures("stand_in_for_module"), pytest.mark.timeout(1200)]

T = TypeVar("T")
CONFIG = PipelineConfig(partitions=2, replication_factor=1, time_scale=0.05, shutdown_deadline_s=5,
                        stages={"intake": StageConfig("bounded", members=1, batch_size=10),
                                "check": StageConfig("flow", members=1, window=4),
                                "generate": StageConfig("flow", members=1, window=4)})


def eventually(probe: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """The first truthy result of `probe` within the time bound."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = probe()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s}s: {what}")


@pytest.fixture
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[supervisor.Client]:
    paths = supervisor.Paths(tmp_path_factory.mktemp("supervisor"))
    client = supervisor.start(paths)
    yield client
    supervisor.shutdown(paths)


def environment(stack: Stack, config: PipelineConfig) -> FleetEnvironment:
    """The stack's addresses, the AI endpoints of the configuration's pipeline on its stand-in."""
    return FleetEnvironment(stack.kafka, stack.database_url,
                            Endpoints.on(stack.env["AI_SERVICE_URL"], config.spec).urls)


@pytest.fixture
def fleet_env(stack: Stack) -> FleetEnvironment:
    return environment(stack, CONFIG)


@contextmanager
def deployment(stack: Stack, daemon: supervisor.Client,
               config: PipelineConfig) -> Iterator[tuple[FleetSupervisor, str, int]]:
    """A run's fleets, one per stage of its pipeline, started through supervisord; stopped and
    its topics deleted after."""
    run_id = unique("supervised")
    topics = events.Topics(run_id, config.spec)
    provision_pipeline(config, topics, stack.kafka)
    fleets = FleetSupervisor(paths=daemon.paths)
    version = ConfigRegistry().register("supervised-test", config, note="test_supervised_fleet")
    try:
        fleets.start(run_id, version, config, environment(stack, config), ready_timeout_s=120)
        yield fleets, run_id, version
    finally:
        fleets.stop(run_id)
        provisioning.delete(stack.connection, topics.all())


@pytest.fixture
def deployed(stack: Stack, daemon: supervisor.Client) -> Iterator[tuple[FleetSupervisor, str, int]]:
    """The reference pipeline's three fleets."""
    with deployment(stack, daemon, CONFIG) as deployed:
        yield deployed


def test_a_killed_fleet_is_running_again_with_a_new_pid(stack: Stack, daemon: supervisor.Client,
                                                       deployed: tuple[FleetSupervisor, str, int]) -> None:
    fleets, run_id, _ = deployed
    check = next(d for d in fleets.running(run_id) if d.stage == "check")
    assert check.pid and daemon.info(check.program).pid == check.pid

    os.kill(check.pid, signal.SIGKILL)
    back = eventually(lambda: (info := daemon.info(check.program)).state == "RUNNING"
                      and info.pid not in (0, check.pid) and info, 60, "the killed fleet RUNNING again")

    status = subprocess.run([str(Path(sys.executable).parent / "supervisorctl"), "-c",
                             str(daemon.paths.conf), "status"], capture_output=True, text=True, timeout=30)
    line = next(line for line in status.stdout.splitlines() if line.startswith(check.program))
    assert line.split()[1] == "RUNNING" and f"pid {back.pid}," in line, status.stdout

    eventually(lambda: fleets.check(run_id)["check"] == "healthy", 30, "the restarted fleet serves /metrics")
    row = query(stack.database_url, "SELECT pid, restarts, process_state, health FROM deployments "
                "WHERE program = %s AND state = 'running'", check.program)
    assert row == [(back.pid, 1, "RUNNING", "healthy")]


def test_stop_is_graceful_and_removes_the_programs(stack: Stack, daemon: supervisor.Client,
                                                  deployed: tuple[FleetSupervisor, str, int]) -> None:
    fleets, run_id, _ = deployed
    programs = [d.program for d in fleets.running(run_id)]
    assert sorted(p.name for p in daemon.programs()) == sorted(programs)

    assert fleets.stop(run_id) == {"intake": 0, "check": 0, "generate": 0}
    assert daemon.programs() == []
    assert not any(daemon.paths.program_conf(p).exists() for p in programs)
    rows = query(stack.database_url, "SELECT state, health, process_state FROM deployments "
                 "WHERE run_id = %s", run_id)
    assert rows == [("stopped", "stopped", "STOPPED")] * 3
    closed = query(stack.database_url, "SELECT count(DISTINCT member) FROM rebalance_events "
                   "WHERE run_id = %s AND event = 'revoke'", run_id)
    assert closed == [(3,)]  # every member gave its partitions back: a graceful leave


def test_scale_restarts_the_stage_with_the_new_member_count(
        stack: Stack, daemon: supervisor.Client, fleet_env: FleetEnvironment,
        deployed: tuple[FleetSupervisor, str, int]) -> None:
    fleets, run_id, version = deployed
    before = next(d for d in fleets.running(run_id) if d.stage == "check")

    fleets.scale(run_id, version, CONFIG.with_stages(check=replace(CONFIG.stage("check"), members=2)),
                 fleet_env, stages=("check",))

    after = next(d for d in fleets.running(run_id) if d.stage == "check")
    assert (after.program, after.metrics_port) == (before.program, before.metrics_port)
    assert after.pid not in (None, before.pid)
    cmdline = Path(f"/proc/{after.pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[cmdline.index(b"--members") + 1] == b"2"
    rows = query(stack.database_url, "SELECT state, members, exit_code FROM deployments "
                 "WHERE program = %s ORDER BY id", before.program)
    assert rows == [("scaled", 1, 0), ("running", 2, None)]
    members = query(stack.database_url, "SELECT DISTINCT member FROM rebalance_events WHERE run_id = %s "
                    "AND event = 'assign' AND member LIKE 'check-%%' ORDER BY 1", run_id)
    assert members == [("check-0",), ("check-1",)]


def test_another_pipeline_gets_a_fleet_per_stage_with_its_endpoints(stack: Stack,
                                                                    daemon: supervisor.Client) -> None:
    config = replace(CONFIG, pipeline="text_moderation", stages={})  # the pipeline's default modes
    with deployment(stack, daemon, config) as (fleets, run_id, _):
        running = {d.stage: d for d in fleets.running(run_id)}
        assert sorted(running) == sorted(config.spec.stage_names)  # moderate, summarize, classify, join
        assert fleets.check(run_id) == dict.fromkeys(running, "healthy")
        program = daemon.paths.program_conf(running["summarize"].program).read_text()
        assert "AI_ENDPOINTS" in program and "/v1/summarize" in program
        assert fleets.stop(run_id) == dict.fromkeys(running, 0)


def test_a_fleet_whose_member_dies_exits_70_and_is_started_again(stack: Stack,
                                                                daemon: supervisor.Client) -> None:
    # librdkafka refuses statistics.interval.ms -1 when the member creates its consumer, so the
    # member's loop dies right after start while the rest of the process is fine (its AI endpoint
    # given, never called: a fleet without it refuses to start at all, with another status).
    run_id = unique("member-dies")
    name = supervisor.program_name("fleet", run_id, "check")
    daemon.add(supervisor.Program(
        name, [sys.executable, "-m", "consumers.runtime.fleet", "--stage", "check", "--run-id", run_id,
               "--members", "2", "--stats-interval-ms", "-1"],
        REPO, {**stack.connection.environment(), "DATABASE_URL": stack.database_url,
               **Endpoints({"check": "http://127.0.0.1:9/v1/check"}).environment()},
        stopwaitsecs=40))
    try:
        pids: set[int] = set()

        def restarted() -> bool:
            if pid := daemon.info(name).pid:
                pids.add(pid)
            return len(pids) >= 2

        eventually(restarted, 60, "a second process after the first exited")
    finally:
        daemon.remove(name)
    # supervisord keeps no exit status in its API for an exit within startsecs (BACKOFF, seen
    # only for a second between two polls): its log has every exit.
    exits = [line for line in daemon.paths.logfile.read_text().splitlines()
             if f"exited: {name} (" in line]
    assert exits and all("(exit status 70; not expected)" in line for line in exits), exits
    log = daemon.paths.program_log(name).read_text()
    assert re.search(r"CRITICAL .*member check-\d failed", log), log[-2000:]
