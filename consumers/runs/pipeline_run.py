"""One whole pipeline run: topics, a fleet per stage of its spec, load, and waiting for the outcome.

Tests, benchmarks and the Airflow operators all drive the pipeline through this module, so a
configuration means the same thing wherever it is run. Completion is read from PostgreSQL
(what the pipeline recorded), not from the fleets' own counters.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field

import psycopg2
from psycopg2.extensions import connection
from rich.progress import Progress

from consumers.config import events
from consumers.config.candidate import Endpoints, PipelineConfig
from consumers.config.kafka_connection import KafkaAccess
from consumers.kafka_clients import acls
from consumers.kafka_clients.provisioning import delete, provision
from consumers.loadgen.source import SourceReport, Waiting, send_in_process
from consumers.runtime.fleet import Fleet
from consumers.runtime.fleet_process import FleetProcess
from consumers.runtime.fleet_settings import settings_for
from consumers.runtime.storage import Storage
from measure.figures import TERMINAL


@dataclass
class Pipeline:
    """A provisioned pipeline with its fleets running; build it with `running_pipeline`."""

    run_id: str
    topics: events.Topics
    config: PipelineConfig
    kafka: KafkaAccess
    database_url: str
    fleets: dict[str, Fleet | FleetProcess] = field(default_factory=dict)

    def send(self, count: int, rate: float | None = None, reject_share: float = 0.0,
             key_strategy: str | None = None, progress: bool = False,
             waiting: Waiting | None = None) -> SourceReport:
        return send_in_process(self.kafka.of("source"), self.config.producer_profile or self.config.profile,
                               key_strategy or self.config.key_strategy, self.topics, self.run_id,
                               count, rate=rate, reject_share=reject_share, progress=progress,
                               batch_records=self.config.producer_batch_records(None), waiting=waiting)

    def status_counts(self) -> dict[str, int]:
        with closing(RunRecords(self)) as records:
            return records.status_counts()

    def settled(self) -> int:
        """Requests that reached a terminal status and that every entry stage took (see
        `RunRecords.settled`)."""
        with closing(RunRecords(self)) as records:
            return records.settled()

    def wait_terminal(self, expected: int, timeout_s: float, progress: bool = False) -> dict[str, int]:
        """Wait until `expected` requests are settled (every stage done); return the status counts.
        Polls over one connection: a new one every poll (a server process forked, a password
        checked) was load on the server beside the run being measured."""
        deadline = time.monotonic() + timeout_s
        with closing(RunRecords(self)) as records, Progress(disable=not progress, transient=True) as bar:
            task = bar.add_task(f"run {self.run_id}", total=expected)
            while True:
                done = records.settled()
                bar.update(task, completed=done)
                if done >= expected or time.monotonic() > deadline:
                    return records.status_counts()
                time.sleep(0.25)


class RunRecords:
    """What a run recorded, read over one connection: opened on the first read, and again when
    a server restart since the last one broke it."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._conn: connection | None = None

    def status_counts(self) -> dict[str, int]:
        return dict(self._rows("SELECT status, count(*) FROM requests WHERE run_id = %s GROUP BY status",
                               (self.pipeline.run_id,)))

    def settled(self) -> int:
        """Requests that reached a terminal status and that every entry stage took: a request's
        events may enter by several topics (the reference pipeline's upload and style choice),
        and any of them can finish first."""
        entries = len(self.pipeline.topics.spec.entry_stages)
        (count,), = self._rows("SELECT count(*) FROM requests WHERE run_id = %s AND status = ANY(%s) "
                               "AND entries >= %s", (self.pipeline.run_id, list(TERMINAL), entries))
        return count

    def _rows(self, sql: str, params: tuple) -> list[tuple]:
        if self._conn is not None:
            try:
                return self._read(self._conn, sql, params)
            except psycopg2.OperationalError:
                if not self._conn.closed:
                    raise
        self._conn = psycopg2.connect(self.pipeline.database_url)
        return self._read(self._conn, sql, params)

    @staticmethod
    def _read(conn: connection, sql: str, params: tuple) -> list[tuple]:
        with conn, conn.cursor() as cur:  # a transaction per read: each sees the latest
            cur.execute(sql, params)
            return cur.fetchall()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def provision_pipeline(config: PipelineConfig, topics: events.Topics, kafka: KafkaAccess) -> None:
    """Create the run's topics (stage inputs get the configured partitions) and, on a secured
    cluster, let each role's principal use its own topics and group."""
    admin = kafka.default.admin()
    provision(admin, topics.all(), config.partitions, config.profile, config.replication_factor)
    acls.grant(admin, topics, kafka)


def remove_pipeline(topics: events.Topics, kafka: KafkaAccess) -> list[str]:
    """Delete a finished run's topics and the grants on them; return the topics deleted."""
    admin = kafka.default.admin()
    acls.revoke(admin, topics, kafka)
    return delete(admin, topics.all())


def request_stops(fleets: list[Fleet | FleetProcess]) -> None:
    for fleet in fleets:
        fleet.request_stop()


@contextmanager
def running_pipeline(config: PipelineConfig, kafka: KafkaAccess, database_url: str, endpoints: Endpoints,
                     run_id: str | None = None, stages: tuple[str, ...] | None = None,
                     scenario: str = "", fleet_processes: bool = False) -> Iterator[Pipeline]:
    """Provision fresh topics, start the stage fleets (`stages`, default every stage of the
    configuration's pipeline), yield, and stop the fleets gracefully. The run's `runs` row holds
    when it started and when its fleets stopped.

    `fleet_processes` runs each stage's fleet in a child process, as deployments do (benchmarks);
    in-process fleets (the default) let tests reach into the members.
    """
    run_id = run_id or new_run_id()
    topics = events.Topics(run_id, config.spec)
    provision_pipeline(config, topics, kafka)
    with closing(Storage(database_url, pool_size=1)) as storage:
        storage.start_run(run_id, scenario, config.to_dict())
    pipeline = Pipeline(run_id, topics, config, kafka, database_url)
    try:
        with ExitStack() as stack:
            # Every stage's fleet starts and joins its group at once, and all are told to stop
            # before any is waited for (the callback, entered last, runs first on the way out).
            for stage in topics.spec.stage_names if stages is None else stages:
                settings = settings_for(config, stage, run_id, topics, kafka, database_url, endpoints)
                fleet = FleetProcess(settings) if fleet_processes else Fleet(settings)
                stack.enter_context(fleet.running())
                pipeline.fleets[stage] = fleet
            stack.callback(request_stops, list(pipeline.fleets.values()))
            for fleet in pipeline.fleets.values():
                fleet.wait_assigned()
            yield pipeline
    finally:
        with closing(Storage(database_url, pool_size=1)) as storage:
            storage.finish_run(run_id)  # its fleets stopped: the run's end time
