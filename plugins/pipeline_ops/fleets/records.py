"""The `deployments` table as every backend keeps it, and readiness as every backend waits for it.

A row per (run, stage) fleet while it runs (state `running`), closed as `stopped`, `failed` or
`scaled` (replaced by a row at another member count). `program` names what runs the fleet: a
supervisord program, or `<namespace>/<deployment>` on Kubernetes. A supervisord name never holds a
'/' (host.supervisor.program_name), so each row tells its backend without a column for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from airflow.providers.postgres.hooks.postgres import PostgresHook

from consumers.config.candidate import PipelineConfig
from pipeline_ops.fleets.backend import DOWN

SUPERVISORD, KUBERNETES = "supervisord", "kubernetes"


def backend_of(program: str) -> str:
    return KUBERNETES if "/" in program else SUPERVISORD


@dataclass(frozen=True)
class Deployment:
    """A running row of the `deployments` table."""

    id: int
    stage: str
    program: str
    pid: int | None
    metrics_port: int
    log_file: str  # on Kubernetes: the command that shows the pods' logs


class Records:
    """Reads and writes of the `deployments` table and the members' group events."""

    def __init__(self, postgres_conn_id: str = "postgres_default") -> None:
        self.hook = PostgresHook(postgres_conn_id=postgres_conn_id)

    def now(self) -> object:
        """The database's clock, which the members' events are stamped with."""
        return self.hook.get_first("SELECT now()")[0]

    def running(self, run_id: str, backend: str | None = None) -> list[Deployment]:
        """The run's running fleets, of one backend or of any."""
        rows = self.hook.get_records(
            "SELECT id, stage, program, pid, metrics_port, log_file FROM deployments "
            "WHERE run_id = %s AND state = 'running' AND program IS NOT NULL ORDER BY id",
            parameters=(run_id,))
        deployed = [Deployment(*row) for row in rows]
        return [d for d in deployed if backend in (None, backend_of(d.program))]

    def refuse_running(self, run_id: str) -> None:
        """A run has one set of fleets, whichever backend runs them."""
        backends = sorted({backend_of(d.program) for d in self.running(run_id)})
        if backends:
            raise RuntimeError(f"run {run_id} already has running fleets ({', '.join(backends)}): "
                               "stop them first")

    def describe(self, run_id: str, backend: str) -> list[dict]:
        """The running fleets of the run as recorded (for logs and XCom)."""
        return [{"stage": d.stage, "program": d.program, "pid": d.pid, "metrics_port": d.metrics_port,
                 "log": d.log_file} for d in self.running(run_id, backend)]

    def open(self, run_id: str, version: int, stage: str, program: str, members: int, metrics_port: int,
             log_file: str) -> None:
        self.hook.run("INSERT INTO deployments (run_id, version, stage, program, members, metrics_port, "
                      "state, log_file) VALUES (%s, %s, %s, %s, %s, %s, 'running', %s)",
                      parameters=(run_id, version, stage, program, members, metrics_port, log_file))

    def close(self, deployment_id: int, state: str, exit_code: int | None, process_state: str | None) -> None:
        self.hook.run("UPDATE deployments SET state = %s, exit_code = %s, stopped_at = now(), "
                      "health = 'stopped', process_state = %s WHERE id = %s",
                      parameters=(state, exit_code, process_state, deployment_id))

    def assigned(self, run_id: str, since: object) -> dict[str, int]:
        """Members per stage that were assigned partitions since `since`."""
        return dict(self.hook.get_records(
            "SELECT split_part(member, '-', 1), count(DISTINCT member) FROM rebalance_events "
            "WHERE run_id = %s AND event = 'assign' AND at >= %s GROUP BY 1",
            parameters=(run_id, since)))

    def ever_assigned(self, run_id: str, members: list[str]) -> set[str]:
        """Those of `members` that have had partitions in the run."""
        return {row[0] for row in self.hook.get_records(
            "SELECT DISTINCT member FROM rebalance_events WHERE run_id = %s AND event = 'assign' "
            "AND member = ANY(%s)", parameters=(run_id, members))}


def wait_ready(run_id: str, config: PipelineConfig, stages: tuple[str, ...], timeout_s: float,
               health: Callable[[], dict[str, str]], assigned: Callable[[], dict[str, int]],
               explain: Callable[[dict[str, str]], str]) -> None:
    """Ready = every fleet healthy and, in `stages`, as many members `assigned` as there are
    members (a member beyond the partition count gets none). A fleet that goes down first fails
    at once, with what `explain` says about the fleets down (log tails, where to read them)."""
    deadline = time.monotonic() + timeout_s
    wanted = {s: min(config.stage(s).members, config.partitions) for s in stages}
    while True:
        states = health()
        down = {stage: h for stage, h in states.items() if h in DOWN}
        if down:
            raise RuntimeError(f"fleets of {run_id} exited during start-up: {down}\n{explain(down)}")
        members = assigned()
        if all(h == "healthy" for h in states.values()) and all(
                members.get(s, 0) >= n for s, n in wanted.items()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"fleets of {run_id} not ready in {timeout_s}s: health {states}, "
                               f"assigned members {members} of {wanted}")
        time.sleep(0.5)
