"""The Spark analysis jobs run with the connections they read: on the stack's Spark Connect
server when one is configured, else submitted with spark-submit."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from host.processes import environment
from pipeline_ops.connections import database_url, kafka_access, spark_connect_url


class AnalysisSubmitOperator(SparkSubmitOperator):
    """The analysis application (spark/analyses.py) with the Kafka connection and the database
    URL in the jobs' environment, where they read them: on a command line, `ps` and the task log
    would show their secrets.

    With `spark_connect_conn_id` naming a connection that exists, the jobs run in this task as
    clients of that Connect server, whose JVM is already up and warm; otherwise, and always when
    no id is given, spark-submit runs the application on `conn_id`'s master."""

    def __init__(self, *, kafka_config_id: str = "kafka_default", postgres_conn_id: str = "postgres_default",
                 spark_connect_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kafka_config_id, self.postgres_conn_id = kafka_config_id, postgres_conn_id
        self.spark_connect_conn_id = spark_connect_conn_id

    def execute(self, context: Any) -> None:
        connections = {**kafka_access(self.kafka_config_id).default.environment(),
                       "DATABASE_URL": database_url(self.postgres_conn_id)}
        remote = spark_connect_url(self.spark_connect_conn_id) if self.spark_connect_conn_id else None
        if remote is None:
            self.env_vars = {**(self.env_vars or {}), **connections}
            super().execute(context)
            return
        from spark import analyses  # PySpark's import is the task's, not the DAG file's parse

        argv = list(self.application_args or [])
        self.log.info("running %s on the Spark Connect server of %s",
                      ", ".join(name for name, _ in analyses.split(argv)), self.spark_connect_conn_id)
        with environment(connections):
            analyses.main(argv, remote=remote)

