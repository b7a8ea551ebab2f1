"""The stage fleets of one fault phase, deployed as supervisord programs.

Under supervisord a fleet process that is killed is started again without the harness acting,
which is the recovery the fleet-kill fault measures. Readiness is read from the group events the
members record (`rebalance_events`), not from Kafka's DescribeConsumerGroups: librdkafka aborts
the calling process when a coordinator-bound admin request meets a dropped connection
(confluentinc/librdkafka#4605), which is what a harness that kills brokers provokes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psycopg2

from consumers.config import events
from consumers.config.candidate import PipelineConfig
from consumers.config.kafka_connection import KafkaAccess
from host import supervisor
from pipeline_ops.fleets.program import fleet_program


def holdings(group_events: Iterable[tuple[str, str, Sequence[str]]]) -> dict[str, set[str]]:
    """Partitions each member holds after its recorded events, in order (assign adds,
    revoke and lost remove); every member that had an assignment is a key."""
    held: dict[str, set[str]] = {}
    for member, event, partitions in group_events:
        if event == "assign":
            held.setdefault(member, set()).update(partitions)
        elif event in ("revoke", "lost"):
            held.get(member, set()).difference_update(partitions)
    return held


def remove_leftovers(client: supervisor.Client) -> list[str]:
    """Stop and forget the fleets of an earlier fault run that died before its teardown, so
    they do not take CPU from this one; their names."""
    names = [info.name for info in client.programs() if info.name.startswith("faults-")]
    for name in names:
        client.remove(name)
    return names


@dataclass
class SupervisedFleets:
    """One supervisord program per stage of a run, each running as its stage's principal."""

    client: supervisor.Client
    run_id: str
    config: PipelineConfig
    kafka: KafkaAccess
    env: dict[str, str]  # DATABASE_URL, AI_ENDPOINTS

    def program(self, stage: str) -> str:
        return supervisor.program_name(self.run_id, stage)  # run ids start with "faults-"

    def start(self) -> None:
        for stage in self.config.spec.stages:
            env = {**self.kafka.of(stage).environment(), **self.env}
            self.client.add(fleet_program(self.program(stage), self.run_id, stage, self.config, env,
                                          startsecs=3))

    def pid(self, stage: str) -> int:
        """The fleet's current process id (0 while none runs)."""
        info = self.client.info(self.program(stage))
        return info.pid if info and info.state == "RUNNING" else 0

    def log_file(self, stage: str) -> str:
        return str(self.client.paths.program_log(self.program(stage)))

    def kill(self, stage: str, sig: int) -> int:
        """Signal the stage's fleet process (not supervisord's stop: it must not know); its pid."""
        pid = self.pid(stage)
        if not pid:
            raise RuntimeError(f"fleet {stage} is not running: see {self.log_file(stage)}")
        os.kill(pid, sig)
        return pid

    def wait_stable(self, stages: tuple[str, ...] | None = None, since: float = 0.0,
                    timeout_s: float = 90.0, quiet_s: float = 1.0) -> float:
        """Block until, by the group events the members recorded since `since`, each stage's
        members all had an assignment, every partition is held, and nothing changed for
        `quiet_s`; return when that was first seen (epoch seconds)."""
        stages = stages or self.config.spec.stage_names
        deadline = time.monotonic() + timeout_s
        while True:
            states = {stage: self._group_state(stage, since, quiet_s)
                      for stage in stages}
            if all(state == "ready" for state in states.values()):
                return time.time()
            down = [s for s in stages if (info := self.client.info(self.program(s))) is None
                    or info.state in supervisor.STOPPED_STATES]
            if down or time.monotonic() > deadline:
                raise TimeoutError(f"fleets of {self.run_id} not ready in {timeout_s:.0f}s: {states}; "
                                   f"logs in {self.client.paths.logs}")
            time.sleep(0.5)

    @property
    def topics(self) -> events.Topics:
        return events.Topics(self.run_id, self.config.spec)

    def _group_state(self, stage: str, since: float, quiet_s: float) -> str:
        topic = self.topics.source_of(stage)
        try:
            with psycopg2.connect(self.env["DATABASE_URL"]) as conn, conn.cursor() as cur:
                cur.execute("SELECT member, event, partitions, extract(epoch FROM at) FROM rebalance_events "
                            "WHERE run_id = %s AND group_id = %s AND at >= to_timestamp(%s) ORDER BY id",
                            (self.run_id, self.topics.group_of(stage), since))
                rows = cur.fetchall()
        except psycopg2.Error as exc:
            return f"unknown ({exc.__class__.__name__})"
        held = holdings([(member, event, partitions) for member, event, partitions, _ in rows])
        members = self.config.stage(stage).members
        partitions = {f"{topic}:{p}" for p in range(self.config.partitions)}
        if len(held) < members or set().union(*held.values()) != partitions:
            return f"{len(held)} of {members} members, {len(set().union(*held.values()))} partitions"
        if time.time() - float(rows[-1][3]) < quiet_s:
            return "settling"
        return "ready"

    def stop(self) -> None:
        """Stop every fleet at once (gracefully: members finish, commit and leave), then remove
        their programs."""
        for stage in self.config.spec.stages:
            self.client.stop(self.program(stage))
        for stage in self.config.spec.stages:
            self.client.remove(self.program(stage))
