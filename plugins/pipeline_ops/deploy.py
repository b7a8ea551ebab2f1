"""Deploy a configuration's consumer fleets as supervisord programs on this machine.

One program per (run, stage) runs `python -m consumers.fleet`; supervisord (infra/supervisor.py,
started with the stack) starts a fleet again when it crashes or exits non-zero because a member
died, so a deployment outlives the task that made it and needs no one to watch it. The
`deployments` table keeps the history: program, pid (the new one after a restart), metrics
port, member count, supervisord's state, health and how each ended. Stopping is supervisord's
SIGTERM to the fleet's process group: members finish their in-flight work, commit and leave
their groups (SIGKILL only past the stop wait).
"""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from airflow.providers.postgres.hooks.postgres import PostgresHook

from consumers.events import STAGES
from consumers.kafka_connection import KafkaAccess
from consumers.pipeline_config import PipelineConfig
from infra import supervisor
from infra.fleet_program import fleet_program
from infra.processes import tail

AI_STAGES = ("check", "generate")
TOKEN_ENV = "AI_SERVICE_TOKEN"  # the fleet's default --ai-token-env
# supervisord's states as deployment health (RUNNING is healthy once /metrics answers).
HEALTH = {"STARTING": "starting", "BACKOFF": "restarting", "EXITED": "restarting",
          "STOPPING": "stopping"}


@dataclass(frozen=True)
class FleetEnvironment:
    """Addresses the fleet processes need, taken from the Airflow connections."""

    kafka: KafkaAccess
    database_url: str
    check_url: str
    generate_url: str

    def variables(self, stage: str) -> dict[str, str]:
        """A stage fleet's environment: its own Kafka principal, the addresses, and the AI token
        when this process has one. Secrets travel here (an owner-only program file), never on
        the command line."""
        env = {**self.kafka.of(stage).environment(), "DATABASE_URL": self.database_url,
               "AI_CHECK_URL": self.check_url, "AI_GENERATE_URL": self.generate_url}
        if os.environ.get(TOKEN_ENV):
            env[TOKEN_ENV] = os.environ[TOKEN_ENV]
        return env


@dataclass(frozen=True)
class Deployment:
    """A running row of the `deployments` table."""

    id: int
    stage: str
    program: str
    pid: int | None
    metrics_port: int
    log_file: str


def default_paths() -> supervisor.Paths:
    """The stack's supervisord (SUPERVISOR_URL), else one of Airflow's own (docker-compose)."""
    url = os.environ.get("SUPERVISOR_URL")
    if url:
        return supervisor.Paths.from_url(url)
    return supervisor.Paths(Path(os.environ.get("AIRFLOW_HOME", ".")) / "supervisor")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serves_metrics(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def health_of(info: supervisor.ProcessInfo | None, metrics_port: int) -> str:
    """healthy | starting | restarting | stopping | dead (FATAL, STOPPED or not loaded)."""
    if info is None:
        return "dead"
    if info.state == "RUNNING":
        return "healthy" if _serves_metrics(metrics_port) else "starting"
    return HEALTH.get(info.state, "dead")


class FleetSupervisor:
    """Start, scale, check and stop the fleets of one run, as supervisord programs."""

    def __init__(self, postgres_conn_id: str = "postgres_default",
                 paths: supervisor.Paths | None = None) -> None:
        self.hook = PostgresHook(postgres_conn_id=postgres_conn_id)
        self.paths = paths or default_paths()

    def _client(self) -> supervisor.Client:
        """supervisord, started if it is not running (idempotent)."""
        return supervisor.start(self.paths)

    def start(self, run_id: str, version: int, config: PipelineConfig, env: FleetEnvironment,
              ready_timeout_s: float = 90.0) -> list[dict]:
        """Start every stage's fleet and wait until all their members have partitions."""
        if self.running(run_id):
            raise RuntimeError(f"run {run_id} already has running fleets: stop them first")
        client = self._client()
        since = self.hook.get_first("SELECT now()")[0]
        try:
            for stage in STAGES:
                self._deploy(client, run_id, version, config, env, stage, _free_port())
        except Exception:
            self.stop(run_id)  # no half-deployed run left behind
            raise
        self._wait_ready(client, run_id, config, STAGES, since, ready_timeout_s)
        return self.describe(run_id)

    def scale(self, run_id: str, version: int, config: PipelineConfig, env: FleetEnvironment,
              stages: tuple[str, ...] = AI_STAGES, ready_timeout_s: float = 90.0) -> list[dict]:
        """Run `stages` at `config`'s member counts: each program is rewritten with the new
        --members and restarted (the old process stops gracefully first), on the same port."""
        deployed = {d.stage: d for d in self.running(run_id)}
        missing = [stage for stage in stages if stage not in deployed]
        if missing:
            raise RuntimeError(f"run {run_id} has no running fleet for {missing}: start it first")
        client = self._client()
        since = self.hook.get_first("SELECT now()")[0]
        for stage in stages:
            self._deploy(client, run_id, version, config, env, stage, deployed[stage].metrics_port,
                         replaces=deployed[stage].id)
        self._wait_ready(client, run_id, config, stages, since, ready_timeout_s)
        return self.describe(run_id)

    def _deploy(self, client: supervisor.Client, run_id: str, version: int, config: PipelineConfig,
                env: FleetEnvironment, stage: str, port: int, replaces: int | None = None) -> None:
        """Write and load the stage's program; record it (and close the row it replaces)."""
        members = config.stage(stage).members
        name = supervisor.program_name("fleet", run_id, stage)
        replaced = client.add(fleet_program(name, run_id, stage, config, env.variables(stage), port))
        if replaces is not None:
            self.hook.run("UPDATE deployments SET state = 'scaled', exit_code = %s, stopped_at = now(), "
                          "health = 'stopped', process_state = %s WHERE id = %s",
                          parameters=(replaced.exit_status if replaced else None,
                                      replaced.state if replaced else None, replaces))
        self.hook.run("INSERT INTO deployments (run_id, version, stage, program, members, metrics_port, "
                      "state, log_file) VALUES (%s, %s, %s, %s, %s, %s, 'running', %s)",
                      parameters=(run_id, version, stage, name, members, port,
                                  str(self.paths.program_log(name))))

    def running(self, run_id: str) -> list[Deployment]:
        rows = self.hook.get_records(
            "SELECT id, stage, program, pid, metrics_port, log_file FROM deployments "
            "WHERE run_id = %s AND state = 'running' AND program IS NOT NULL ORDER BY id",
            parameters=(run_id,))
        return [Deployment(*row) for row in rows]

    def describe(self, run_id: str) -> list[dict]:
        """The running fleets of the run as recorded (for logs and XCom)."""
        return [{"stage": d.stage, "program": d.program, "pid": d.pid, "metrics_port": d.metrics_port,
                 "log": d.log_file} for d in self.running(run_id)]

    def _wait_ready(self, client: supervisor.Client, run_id: str, config: PipelineConfig,
                    stages: tuple[str, ...], since: object, timeout_s: float) -> None:
        """Ready = every fleet RUNNING and serving /metrics, and every member of `stages` assigned
        since `since`. A fleet that exits before it is ready fails the deployment at once."""
        deadline = time.monotonic() + timeout_s
        wanted = {s: min(config.stage(s).members, config.partitions) for s in stages}
        while True:
            health = self.check(run_id, client)
            down = {stage: h for stage, h in health.items() if h in ("dead", "restarting")}
            if down:
                logs = "\n".join(f"--- {d.stage}: {d.log_file}\n{tail(Path(d.log_file), 15)}"
                                 for d in self.running(run_id) if d.stage in down)
                self.stop(run_id)
                raise RuntimeError(f"fleets of {run_id} exited during start-up: {down}\n{logs}")
            assigned = dict(self.hook.get_records(
                "SELECT split_part(member, '-', 1), count(DISTINCT member) FROM rebalance_events "
                "WHERE run_id = %s AND event = 'assign' AND at >= %s GROUP BY 1",
                parameters=(run_id, since)))
            if all(h == "healthy" for h in health.values()) and all(
                    assigned.get(s, 0) >= n for s, n in wanted.items()):
                return
            if time.monotonic() > deadline:
                self.stop(run_id)
                raise TimeoutError(f"fleets of {run_id} not ready in {timeout_s}s: health {health}, "
                                   f"assigned members {assigned} of {wanted}")
            time.sleep(0.5)

    def check(self, run_id: str, client: supervisor.Client | None = None) -> dict[str, str]:
        """Health of each stage's fleet, from supervisord and /metrics, recorded in the table
        with supervisord's state, the current pid and a restart when the pid changed."""
        client = client or self._client()
        result = {}
        for d in self.running(run_id):
            info = client.info(d.program)
            health = health_of(info, d.metrics_port)
            pid = info.pid if info and info.pid else None
            restarted = int(pid is not None and d.pid is not None and pid != d.pid)
            self.hook.run(
                "UPDATE deployments SET health = %s, process_state = %s, pid = COALESCE(%s, pid), "
                "restarts = restarts + %s, exit_code = COALESCE(%s, exit_code), spawn_error = %s, "
                "checked_at = now() WHERE id = %s",
                parameters=(health, info.state if info else None, pid, restarted,
                            info.exit_status if info else None, info.spawn_error if info else None,
                            d.id))
            result[d.stage] = health
        return result

    def stop(self, run_id: str) -> dict[str, int | None]:
        """Stop every fleet of the run at once (gracefully; supervisord kills past the stop
        wait) and remove their programs; each stage's exit code (None: none known). A fleet
        that was failing to start (BACKOFF, FATAL) or exits non-zero is recorded as failed."""
        deployed = self.running(run_id)
        if not deployed:
            return {}
        client = self._client()
        crashing = {d.stage: (info := client.info(d.program)) is not None
                    and info.state in ("BACKOFF", "FATAL") for d in deployed}
        for d in deployed:
            client.stop(d.program)
        codes: dict[str, int | None] = {}
        for d in deployed:
            final = client.remove(d.program)
            codes[d.stage] = final.exit_status if final else None
            failed = crashing[d.stage] or codes[d.stage] not in (0, None)
            self.hook.run("UPDATE deployments SET state = %s, exit_code = %s, stopped_at = now(), "
                          "health = 'stopped', process_state = %s WHERE id = %s",
                          parameters=("failed" if failed else "stopped", codes[d.stage],
                                      final.state if final else None, d.id))
        return codes
