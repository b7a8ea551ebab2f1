"""The steps the operators that run a pipeline share: provision a run's topics, deploy its fleets
where the fleet connection says, drive its load, stop its fleets. The deploy, load, trials and
capacity operators are each a sequence of these."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from airflow.providers.apache.kafka.hooks.client import KafkaAdminClientHook

from consumers.config import events
from consumers.config.candidate import PipelineConfig
from consumers.config.kafka_connection import KafkaAccess
from consumers.kafka_clients import acls
from consumers.kafka_clients.provisioning import TopicReport, provision
from consumers.runs.pipeline_run import Pipeline
from pipeline_ops import stand_in
from pipeline_ops.connections import (
    database_url,
    endpoint_keys,
    endpoint_urls,
    kafka_access,
    stand_in_endpoints,
)
from pipeline_ops.fleets import FleetBackend, FleetEnvironment, FleetSupervisor, backend_for
from pipeline_ops.registry import Version


@dataclass(frozen=True)
class Connections:
    """The Airflow connections a run uses: Kafka (admin and roles), the database, and where the
    deploy operator's fleets run (pipeline_ops.fleets.backend_for)."""

    kafka: str = "kafka_default"
    postgres: str = "postgres_default"
    fleet: str = "fleet_default"

    def fleets(self) -> FleetBackend:
        return backend_for(self.fleet, self.postgres)

    def environment(self, config: PipelineConfig) -> FleetEnvironment:
        """Addresses, principals and keys for the fleet processes of the configuration's pipeline."""
        spec = config.spec
        return FleetEnvironment(kafka=kafka_access(self.kafka), database_url=database_url(self.postgres),
                                ai_urls=endpoint_urls(spec), ai_keys=endpoint_keys(spec))


def provision_topics(kafka_config_id: str, topics: events.Topics, partitions: int, profile: str,
                     replication_factor: int | None) -> list[TopicReport]:
    """Create or grow a run's topics (its pipeline's) through the `kafka_default` admin client,
    and grant each role's principal its own topics and group on a secured cluster."""
    admin = KafkaAdminClientHook(kafka_config_id=kafka_config_id).get_conn
    reports = provision(admin, topics.all(), partitions, profile, replication_factor)
    acls.grant(admin, topics, kafka_access(kafka_config_id))
    return reports


def fit_stand_in(config: PipelineConfig, limit: int) -> list[str]:
    """When the pipeline's endpoints are served by the AI stand-in: set it to the run's time scale
    and `limit` (pipeline_ops.stand_in). The stand-ins' base URLs; none for real APIs."""
    served = stand_in_endpoints(config.spec)
    if served:
        stand_in.configure_for_run(served, config.time_scale, limit)
    return sorted(served)


@contextmanager
def measured(conns: Connections, run_id: str, version: Version) -> Iterator[FleetEnvironment]:
    """Fresh topics for `run_id` and the version's fleets on them, stopped on the way out: one
    measurement (a trial, a capacity search). Its fleets run under supervisord on this machine,
    beside the AI stand-in, whatever the fleet connection says."""
    config = version.config
    provision_topics(conns.kafka, events.Topics(run_id, config.spec), config.partitions, config.profile,
                     config.replication_factor)
    fleets, env = FleetSupervisor(conns.postgres), conns.environment(config)
    fleets.start(run_id, version.version, config, env)
    try:
        yield env
    finally:
        fleets.stop(run_id)


def request_count(burst: int | str, rate: float | str, duration_s: float | str) -> tuple[int, float | None]:
    """(requests to send, rate or None for a burst) from the form's load fields."""
    rate_value = float(rate or 0) or None
    count = round(rate_value * float(duration_s or 0)) if rate_value else int(burst or 0)
    if count <= 0:
        raise ValueError("nothing to send: give a burst, or a rate with a duration")
    return count, rate_value


def drive_load(run_id: str, config: PipelineConfig, kafka: KafkaAccess, database_url: str, count: int,
               rate: float | None, timeout_s: float) -> dict[str, Any]:
    """Send the requests of a run and wait until each reached a final state."""
    pipeline = Pipeline(run_id, events.Topics(run_id, config.spec), config, kafka, database_url)
    started = time.time()
    sent = pipeline.send(count, rate=rate)
    counts = pipeline.wait_terminal(count, timeout_s)
    return {"produced": len(sent.request_ids), "counts": counts, "load_started": started,
            "seconds": round(time.time() - started, 2)}
