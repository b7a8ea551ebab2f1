"""Deploy a configuration's consumer fleets as supervised processes on this machine.

One `python -m consumers.fleet` process per stage, each in its own session so it outlives the
task that started it; pids, metrics ports, health and exit codes are recorded in the
`deployments` table, so any later task (or a person) can see what runs and stop it. Stopping
is SIGTERM: the fleets finish their in-flight work, commit and leave their groups.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from airflow.providers.postgres.hooks.postgres import PostgresHook

from consumers.events import STAGES
from consumers.pipeline_config import PipelineConfig

LOG_DIR = Path(os.environ.get("AIRFLOW_HOME", ".")) / "fleets"


@dataclass(frozen=True)
class FleetEnvironment:
    """Addresses the fleet processes need, taken from the Airflow connections."""

    bootstrap: str
    database_url: str
    check_url: str
    generate_url: str

    def variables(self) -> dict[str, str]:
        return {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap, "DATABASE_URL": self.database_url,
                "AI_CHECK_URL": self.check_url, "AI_GENERATE_URL": self.generate_url}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


class FleetSupervisor:
    """Start, check and stop the fleets of one run."""

    def __init__(self, postgres_conn_id: str = "postgres_default") -> None:
        self.hook = PostgresHook(postgres_conn_id=postgres_conn_id)

    def start(self, run_id: str, version: int, config: PipelineConfig, env: FleetEnvironment,
              ready_timeout_s: float = 90.0) -> list[dict]:
        """Start every stage's fleet and wait until all their members have partitions."""
        if self.running(run_id):
            raise RuntimeError(f"run {run_id} already has running fleets: stop them first")
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        started = []
        for stage in STAGES:
            port = _free_port()
            log_file = LOG_DIR / f"{run_id}-{stage}.log"
            cmd = [sys.executable, "-m", "consumers.fleet", "--stage", stage, "--run-id", run_id,
                   "--config", config.to_json(), "--metrics-port", str(port)]
            with open(log_file, "ab") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env.variables(),
                                        start_new_session=True, stdin=subprocess.DEVNULL)
            self.hook.run("INSERT INTO deployments (run_id, version, stage, pid, metrics_port, state, "
                          "log_file) VALUES (%s, %s, %s, %s, %s, 'running', %s)",
                          parameters=(run_id, version, stage, proc.pid, port, str(log_file)))
            started.append({"stage": stage, "pid": proc.pid, "metrics_port": port, "log": str(log_file)})
        self._wait_ready(run_id, config, ready_timeout_s)
        return started

    def running(self, run_id: str) -> list[tuple]:
        return self.hook.get_records("SELECT stage, pid, metrics_port, log_file FROM deployments "
                                     "WHERE run_id = %s AND state = 'running'", parameters=(run_id,))

    def _wait_ready(self, run_id: str, config: PipelineConfig, timeout_s: float) -> None:
        """Ready = every process serves /metrics and every member got an assignment."""
        deadline = time.monotonic() + timeout_s
        while True:
            health = self.check(run_id)
            if any(h == "dead" for h in health.values()):
                self.stop(run_id)
                raise RuntimeError(f"a fleet process of {run_id} died during start-up: {health}")
            assigned = dict(self.hook.get_records(
                "SELECT split_part(member, '-', 1), count(DISTINCT member) FROM rebalance_events "
                "WHERE run_id = %s AND event = 'assign' GROUP BY 1", parameters=(run_id,)))
            wanted = {s: min(config.stage(s).members, config.partitions) for s in STAGES}
            if all(h == "healthy" for h in health.values()) and all(
                    assigned.get(s, 0) >= n for s, n in wanted.items()):
                return
            if time.monotonic() > deadline:
                self.stop(run_id)
                raise TimeoutError(f"fleets of {run_id} not ready in {timeout_s}s: health {health}, "
                                   f"assigned members {assigned} of {wanted}")
            time.sleep(0.5)

    def check(self, run_id: str) -> dict[str, str]:
        """Health of each stage's process (healthy | starting | dead), recorded in the table."""
        result = {}
        for stage, pid, port, _ in self.running(run_id):
            if not _alive(pid):
                health = "dead"
            else:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                        health = "healthy" if r.status == 200 else "starting"
                except OSError:
                    health = "starting"
            self.hook.run("UPDATE deployments SET health = %s WHERE run_id = %s AND stage = %s "
                          "AND state = 'running'", parameters=(health, run_id, stage))
            result[stage] = health
        return result

    def stop(self, run_id: str, deadline_s: float = 60.0) -> dict[str, int | None]:
        """SIGTERM every fleet of the run, wait for a graceful exit, SIGKILL past the deadline."""
        codes: dict[str, int | None] = {}
        rows = self.running(run_id)
        for _, pid, _, _ in rows:
            if _alive(pid):
                os.killpg(pid, signal.SIGTERM)
        end = time.monotonic() + deadline_s
        for stage, pid, _, _ in rows:
            while _alive(pid) and time.monotonic() < end:
                time.sleep(0.2)
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
            codes[stage] = _reap(pid)
            state = "stopped" if codes[stage] in (0, None) else "failed"
            self.hook.run("UPDATE deployments SET state = %s, exit_code = %s, stopped_at = now(), "
                          "health = 'stopped' WHERE run_id = %s AND stage = %s AND state = 'running'",
                          parameters=(state, codes[stage], run_id, stage))
        return codes


def _reap(pid: int) -> int | None:
    """Exit code when the process was our child (None when another task started it)."""
    try:
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
    except ChildProcessError:
        return None
