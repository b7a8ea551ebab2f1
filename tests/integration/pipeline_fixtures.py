"""The AI stand-in served over HTTP on loopback, and SQL read-backs of a pipeline run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg2
import requests

from consumers.ai_service import EndpointConfig, ServiceConfig, serve
from consumers.pipeline_config import Endpoints

TIME_SCALE = 0.02  # generate 3 s -> 60 ms, check 0.5 s -> 10 ms


@dataclass
class AIService:
    base_url: str

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints(f"{self.base_url}/v1/check", f"{self.base_url}/v1/generate")

    def stats(self) -> dict:
        return requests.get(f"{self.base_url}/v1/stats", timeout=5).json()

    def reset(self) -> None:
        requests.post(f"{self.base_url}/v1/stats/reset", timeout=5).raise_for_status()

    def configure(self, **changes: object) -> None:
        requests.put(f"{self.base_url}/v1/config", json=changes, timeout=5).raise_for_status()


@contextmanager
def ai_service(time_scale: float = TIME_SCALE, limit: int = 64) -> Iterator[AIService]:
    config = ServiceConfig(time_scale=time_scale, check=EndpointConfig(latency_s=0.5, limit=limit),
                           generate=EndpointConfig(latency_s=3.0, limit=limit))
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
