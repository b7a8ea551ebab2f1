"""One whole pipeline run: topics, the three stage fleets, load, and waiting for the outcome.

Tests, benchmarks and the Airflow operators all drive the pipeline through this module, so a
configuration means the same thing wherever it is run. Completion is read from PostgreSQL
(what the pipeline recorded), not from the fleets' own counters.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace

import psycopg2
from rich.progress import Progress

from consumers import events
from consumers.ai_client import RetryPolicy
from consumers.consumer import MemberSettings
from consumers.fleet import Fleet, FleetSettings
from consumers.producer import KeyedProducer
from consumers.provisioning import provision
from consumers.source import SourceReport, send_requests

TERMINAL = ("completed", "rejected", "dead_lettered")


@dataclass(frozen=True)
class StageConfig:
    """How one stage consumes."""

    mode: str = "flow"
    members: int = 1
    window: int = 16
    batch_size: int = 1


@dataclass(frozen=True)
class PipelineConfig:
    """Everything that defines a candidate configuration of the pipeline."""

    partitions: int = 8
    replication_factor: int | None = None
    profile: str = "durability"
    key_strategy: str = "uuid"
    producer_profile: str | None = None  # default: same as `profile`
    group_protocol: str = "classic"
    time_scale: float = 1.0
    intake: StageConfig = StageConfig(mode="bounded", members=1, batch_size=50)
    check: StageConfig = StageConfig()
    generate: StageConfig = StageConfig()
    max_attempts: int = 4
    ai_timeout_s: float = 10.0
    backoff_base_s: float = 0.2
    stats_interval_ms: int = 0

    def stage(self, name: str) -> StageConfig:
        return {"intake": self.intake, "check": self.check, "generate": self.generate}[name]


@dataclass
class Endpoints:
    check_url: str
    generate_url: str
    auth_header: str | None = None


@dataclass
class Pipeline:
    """A provisioned pipeline with its fleets running; build it with `running_pipeline`."""

    run_id: str
    topics: events.Topics
    config: PipelineConfig
    bootstrap: str
    database_url: str
    fleets: dict[str, Fleet] = field(default_factory=dict)

    def send(self, count: int, rate: float | None = None, reject_share: float = 0.0,
             key_strategy: str | None = None, progress: bool = False) -> SourceReport:
        producer = KeyedProducer(self.bootstrap,
                                 profile=self.config.producer_profile or self.config.profile,
                                 key_strategy=key_strategy or self.config.key_strategy)
        try:
            return send_requests(producer, self.topics, self.run_id, count, rate=rate,
                                 reject_share=reject_share, progress=progress)
        finally:
            producer.close()

    def status_counts(self) -> dict[str, int]:
        with psycopg2.connect(self.database_url) as conn, conn.cursor() as cur:
            cur.execute("SELECT status, count(*) FROM requests WHERE run_id = %s GROUP BY status",
                        (self.run_id,))
            return dict(cur.fetchall())

    def wait_terminal(self, expected: int, timeout_s: float, progress: bool = False) -> dict[str, int]:
        """Wait until `expected` requests reached a terminal status; return the status counts."""
        deadline = time.monotonic() + timeout_s
        with Progress(disable=not progress, transient=True) as bar:
            task = bar.add_task(f"run {self.run_id}", total=expected)
            while True:
                counts = self.status_counts()
                done = sum(counts.get(s, 0) for s in TERMINAL)
                bar.update(task, completed=done)
                if done >= expected or time.monotonic() > deadline:
                    return counts
                time.sleep(0.25)


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def fleet_settings(config: PipelineConfig, stage: str, run_id: str, topics: events.Topics,
                   bootstrap: str, database_url: str, endpoints: Endpoints) -> FleetSettings:
    stage_cfg = config.stage(stage)
    member = MemberSettings(
        run_id=run_id, stage=stage, mode=stage_cfg.mode, group_id=f"{topics.prefix}.{stage}",
        bootstrap=bootstrap, profile=config.profile, time_scale=config.time_scale,
        group_protocol=config.group_protocol, batch_size=stage_cfg.batch_size,
        window=stage_cfg.window, buffer=4 * stage_cfg.window,
        stats_interval_ms=config.stats_interval_ms)
    return FleetSettings(
        member=member, members=stage_cfg.members, prefix=topics.prefix, database_url=database_url,
        key_strategy=config.key_strategy,
        check_url=endpoints.check_url, generate_url=endpoints.generate_url,
        ai_timeout_s=config.ai_timeout_s, ai_auth_header=endpoints.auth_header,
        retry=replace(RetryPolicy(), max_attempts=config.max_attempts,
                      backoff_base_s=config.backoff_base_s * max(config.time_scale, 0.05)))


def provision_pipeline(config: PipelineConfig, topics: events.Topics, bootstrap: str) -> None:
    """Create the run's topics: stage inputs get the configured partitions."""
    provision(bootstrap, topics.all(), config.partitions, config.profile, config.replication_factor)


@contextmanager
def running_pipeline(config: PipelineConfig, bootstrap: str, database_url: str, endpoints: Endpoints,
                     run_id: str | None = None, stages: tuple[str, ...] = events.STAGES,
                     scenario: str = "") -> Iterator[Pipeline]:
    """Provision fresh topics, start the stage fleets, yield, and stop the fleets gracefully."""
    run_id = run_id or new_run_id()
    topics = events.Topics(run_id)
    provision_pipeline(config, topics, bootstrap)
    pipeline = Pipeline(run_id, topics, config, bootstrap, database_url)
    with ExitStack() as stack:
        for stage in stages:
            fleet = Fleet(fleet_settings(config, stage, run_id, topics, bootstrap, database_url,
                                         endpoints))
            if not pipeline.fleets:
                fleet.storage.start_run(run_id, scenario, asdict(config))
            stack.enter_context(fleet.running())
            pipeline.fleets[stage] = fleet
        yield pipeline
