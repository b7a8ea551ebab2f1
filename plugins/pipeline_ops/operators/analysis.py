"""The Spark analysis jobs submitted with the connections they read."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from pipeline_ops.connections import database_url, kafka_access


class AnalysisSubmitOperator(SparkSubmitOperator):
    """spark-submit of an analysis job with the Kafka connection and the database URL in the
    driver's environment, where the job reads them: on its command line, `ps` and the task log
    would show their secrets."""

    def __init__(self, *, kafka_config_id: str = "kafka_default",
                 postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kafka_config_id, self.postgres_conn_id = kafka_config_id, postgres_conn_id

    def execute(self, context: Any) -> None:
        self.env_vars = {**(self.env_vars or {}), **kafka_access(self.kafka_config_id).default.environment(),
                         "DATABASE_URL": database_url(self.postgres_conn_id)}
        super().execute(context)
