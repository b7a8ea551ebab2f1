"""Requests driven through a deployed pipeline."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from pipeline_ops.connections import database_url, kafka_access
from pipeline_ops.operators.runs import drive_load, request_count
from pipeline_ops.registry import ConfigRegistry


class LoadTestOperator(BaseOperator):
    """Drive requests through the deployed pipeline and wait until each reached a final state."""

    template_fields = ("run_id", "version", "burst", "rate", "duration_s")

    def __init__(self, *, run_id: str, version: int | str, burst: int | str = 0, rate: float | str = 0,
                 duration_s: float | str = 0, timeout_s: float = 1800,
                 kafka_config_id: str = "kafka_default", postgres_conn_id: str = "postgres_default",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id, self.version, self.burst = run_id, version, burst
        self.rate, self.duration_s, self.timeout_s = rate, duration_s, timeout_s
        self.kafka_config_id, self.postgres_conn_id = kafka_config_id, postgres_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        count, rate = request_count(self.burst, self.rate, self.duration_s)
        config = ConfigRegistry(self.postgres_conn_id).get(int(self.version)).config
        result = drive_load(self.run_id, config, kafka_access(self.kafka_config_id),
                            database_url(self.postgres_conn_id), count, rate, self.timeout_s)
        self.log.info("run %s: %d requests sent, final states %s", self.run_id, count, result["counts"])
        return result
