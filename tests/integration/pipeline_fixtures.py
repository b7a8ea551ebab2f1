"""The AI stand-in served over HTTP on loopback, and SQL read-backs of a pipeline run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg2
import requests

from consumers.config import pipeline_spec
from consumers.config.candidate import Endpoints, PipelineConfig
from consumers.stand_in.config import ServiceConfig
from consumers.stand_in.server import serve

TIME_SCALE = 0.02  # generate 3 s -> 60 ms, check 0.5 s -> 10 ms
# The fleets' clocks of the runs that assert no member was expelled: at TIME_SCALE the session
# timeout is scaled to its floor of 1 s, and on the loaded 2-core machine a member's heartbeat
# missed it (its partitions lost 1.2 s into a burst): a stall of the machine, no rebalance of the
# member's own. At 0.1 it is 4.5 s; the AI stand-in keeps TIME_SCALE.
REBALANCE_TIME_SCALE = 0.1


@dataclass
class AIService:
    base_url: str

    @property
    def endpoints(self) -> Endpoints:
        """The reference pipeline's endpoints."""
        return self.endpoints_of(pipeline_spec.REFERENCE)

    def endpoints_of(self, pipeline: str) -> Endpoints:
        return Endpoints.on(self.base_url, pipeline_spec.load(pipeline))

    def stats(self) -> dict:
        return requests.get(f"{self.base_url}/v1/stats", timeout=5).json()

    def reset(self) -> None:
        requests.post(f"{self.base_url}/v1/stats/reset", timeout=5).raise_for_status()

    def configure(self, **changes: object) -> None:
        requests.put(f"{self.base_url}/v1/config", json=changes, timeout=5).raise_for_status()


@contextmanager
def ai_service(time_scale: float = TIME_SCALE, limit: int = 64) -> Iterator[AIService]:
    """The stand-in serving every shipped spec's endpoints at their latencies, `limit` each."""
    specs = [pipeline_spec.load(name) for name in pipeline_spec.available()]
    config = ServiceConfig.from_specs(specs, time_scale=time_scale, limit=limit)
    server = serve(config, host="127.0.0.1", port=0)
    try:
        yield AIService(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


def query(database_url: str, sql: str, *params: object) -> list[tuple]:
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def scalar(database_url: str, sql: str, *params: object) -> object:
    return query(database_url, sql, *params)[0][0]


def another_version(database_url: str, pipeline: str) -> int:
    """A registered version of `pipeline` that no run promotes, to roll back to (registered here
    when there is none yet)."""
    config = PipelineConfig(pipeline=pipeline, partitions=3)
    rows = query(database_url, "SELECT version FROM configurations WHERE config = %s::jsonb",
                 config.to_json())
    if rows:
        return rows[0][0]
    return query(database_url, "INSERT INTO configurations (name, pipeline, config, note) VALUES "
                 "('rollback-target', %s, %s, 'rollback target of the DAG and UI tests') RETURNING version",
                 config.pipeline, config.to_json())[0][0]
