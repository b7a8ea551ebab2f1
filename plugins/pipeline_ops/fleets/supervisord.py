"""Deploy a configuration's consumer fleets as supervisord programs on this machine.

One program per (run, stage of the configuration's pipeline) runs `python -m consumers.runtime.fleet`;
supervisord (host/supervisor.py, started with the stack) starts a fleet again when it crashes
or exits non-zero because a member died, so a deployment outlives the task that made it and
needs no one to watch it. The `deployments` table keeps the history: program, pid (the new one
after a restart), metrics port, member count, supervisord's state, health and how each ended.
Stopping is supervisord's SIGTERM to the fleet's process group: members finish their in-flight
work, commit and leave their groups (SIGKILL only past the stop wait).
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import urllib.request
from pathlib import Path

from consumers.config.candidate import PipelineConfig
from host import supervisor
from host.processes import tail
from pipeline_ops.fleets.backend import FleetEnvironment
from pipeline_ops.fleets.program import fleet_program
from pipeline_ops.fleets.records import SUPERVISORD, Deployment, Records, wait_ready

# supervisord's states as deployment health. A fleet whose process is up (STARTING or RUNNING)
# is healthy once /metrics answers, as a pod is ready once its probe passes: supervisord calls a
# start successful only `startsecs` after it (fleet_program), which is for its restart
# accounting, while the fleet serves and takes partitions about two seconds in.
UP = ("STARTING", "RUNNING")
HEALTH = {"BACKOFF": "restarting", "EXITED": "restarting", "STOPPING": "stopping"}
# A fleet's /metrics port comes from here (`free_port`): below Linux's ephemeral range (32768 up)
# like every local stack's ports (infra/layout.py says why), and above them all (the secure
# stack's highest, its third controller, is 31194).
FLEET_METRICS_PORTS = range(31500, 32768)
_next_port = itertools.count(random.randrange(len(FLEET_METRICS_PORTS)))


def free_port(ports: range = FLEET_METRICS_PORTS) -> int:
    """A port of `ports` that can be listened on now. Each call probes from past the port the
    last one gave, from a random place at first, so that the fleets of one run, started before
    any of them listens, get different ports."""
    for _ in range(len(ports)):
        port = ports[next(_next_port) % len(ports)]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


def default_paths() -> supervisor.Paths:
    """The stack's supervisord (SUPERVISOR_URL), else one of Airflow's own (docker-compose)."""
    url = os.environ.get("SUPERVISOR_URL")
    if url:
        return supervisor.Paths.from_url(url)
    return supervisor.Paths(Path(os.environ.get("AIRFLOW_HOME", ".")) / "supervisor")


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
    if info.state in UP:
        return "healthy" if _serves_metrics(metrics_port) else "starting"
    return HEALTH.get(info.state, "dead")


def canary_deployment(run_id: str, canary: int) -> str:
    """The deployment key a canary's fleets are recorded under, apart from the run's own."""
    return f"{run_id}.canary-{canary}"


class FleetSupervisor:
    """Start, scale, check and stop the fleets of one run, as supervisord programs."""

    def __init__(self, postgres_conn_id: str = "postgres_default",
                 paths: supervisor.Paths | None = None) -> None:
        self.records = Records(postgres_conn_id)
        self.paths = paths or default_paths()

    def _client(self) -> supervisor.Client:
        """supervisord, started if it is not running (idempotent)."""
        return supervisor.start(self.paths)

    def start(self, run_id: str, version: int, config: PipelineConfig, env: FleetEnvironment,
              ready_timeout_s: float = 90.0) -> list[dict]:
        """Start every stage's fleet and wait until all their members have partitions."""
        self.records.refuse_running(run_id)
        client = self._client()
        since = self.records.now()
        stages = config.spec.stage_names
        try:
            for stage in stages:
                self._deploy(client, run_id, version, config, env, stage, free_port())
        except Exception:
            self.stop(run_id)  # no half-deployed run left behind
            raise
        self._wait_ready(client, run_id, config, stages, since, ready_timeout_s)
        return self.describe(run_id)

    def scale(self, run_id: str, version: int, config: PipelineConfig, env: FleetEnvironment,
              stages: tuple[str, ...] | None = None, ready_timeout_s: float = 90.0) -> list[dict]:
        """Run `stages` (default: the pipeline's AI stages) at `config`'s member counts: each
        program is rewritten with the new --members and restarted (the old process stops
        gracefully first), on the same port."""
        stages = config.spec.ai_stages if stages is None else stages
        deployed = {d.stage: d for d in self.running(run_id)}
        missing = [stage for stage in stages if stage not in deployed]
        if missing:
            raise RuntimeError(f"run {run_id} has no running fleet for {missing}: start it first")
        client = self._client()
        since = self.records.now()
        for stage in stages:
            self._deploy(client, run_id, version, config, env, stage, deployed[stage].metrics_port,
                         replaces=deployed[stage].id)
        self._wait_ready(client, run_id, config, stages, since, ready_timeout_s)
        return self.describe(run_id)

    def start_canary(self, run_id: str, canary: int, version: int, config: PipelineConfig,
                     env: FleetEnvironment, stages: tuple[str, ...]) -> list[dict]:
        """Start canary `canary`'s fleets of `stages`, writing under run `run_id`: recorded as the
        deployment `canary_deployment(run_id, canary)`, so `stop` of that key stops them alone.
        They are ready without partitions (the steps lend them theirs)."""
        key = canary_deployment(run_id, canary)
        self.records.refuse_running(key)
        client = self._client()
        try:
            for stage in stages:
                self._deploy(client, run_id, version, config, env, stage, free_port(), canary=canary)
        except Exception:
            self.stop(key)
            raise
        return self.describe(key)

    def _deploy(self, client: supervisor.Client, run_id: str, version: int, config: PipelineConfig,
                env: FleetEnvironment, stage: str, port: int, replaces: int | None = None,
                canary: int | None = None) -> None:
        """Write and load the stage's program; record it (and close the row it replaces)."""
        key = run_id if canary is None else canary_deployment(run_id, canary)
        name = supervisor.program_name("fleet", key, stage)
        replaced = client.add(fleet_program(name, run_id, stage, config, env.variables(stage), port,
                                            version=version, canary=canary))
        if replaces is not None:
            self.records.close(replaces, "scaled", replaced.exit_status if replaced else None,
                               replaced.state if replaced else None)
        self.records.open(key, version, stage, name, config.stage(stage).members, port,
                          str(self.paths.program_log(name)))

    def running(self, run_id: str) -> list[Deployment]:
        return self.records.running(run_id, SUPERVISORD)

    def describe(self, run_id: str) -> list[dict]:
        """The running fleets of the run as recorded (for logs and XCom)."""
        return self.records.describe(run_id, SUPERVISORD)

    def _wait_ready(self, client: supervisor.Client, run_id: str, config: PipelineConfig,
                    stages: tuple[str, ...], since: object, timeout_s: float) -> None:
        """Ready as records.wait_ready says, every member restarted and assigned since `since`;
        the fleets' log tails explain a fleet that exits first. The run's fleets are stopped when
        they do not get ready."""
        def tails(down: dict[str, str]) -> str:
            return "\n".join(f"--- {d.stage}: {d.log_file}\n{tail(Path(d.log_file), 15)}"
                             for d in self.running(run_id) if d.stage in down)

        try:
            wait_ready(run_id, config, stages, timeout_s, lambda: self.check(run_id, client),
                       lambda: self.records.assigned(run_id, since), tails)
        except Exception:
            self.stop(run_id)
            raise

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
            self.records.hook.run(
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
            self.records.close(d.id, "failed" if failed else "stopped", codes[d.stage],
                               final.state if final else None)
        return codes
