"""The Airflow connections as the runtime takes them: the one place that reads them.

`kafka_default` (the Kafka provider's connection: client settings in its extra) is the admin's
connection, which provisions; on a secured cluster `kafka_default_<role>` holds the principal
of one role (`source`, or a stage name of any pipeline spec: `pipeline_spec.roles()`), and a role
without one runs as the admin. Airflow masks the extra's secret values in task logs when a connection is read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.exceptions import AirflowNotFoundException
from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow.sdk import BaseHook

from consumers.config.kafka_connection import KafkaAccess, KafkaConnection
from consumers.config.pipeline_spec import PipelineSpec, roles


def kafka_connection(conn_id: str) -> KafkaConnection:
    """One Airflow Kafka connection's client settings (its extra, less any client's own)."""
    return KafkaConnection.from_client_config(BaseHook.get_connection(conn_id).extra_dejson)


def kafka_access(kafka_config_id: str) -> KafkaAccess:
    """The admin connection and the roles' own ones, where defined."""
    own = {}
    for role in roles():
        try:
            own[role] = kafka_connection(f"{kafka_config_id}_{role}")
        except AirflowNotFoundException:
            continue
    return KafkaAccess(kafka_connection(kafka_config_id), own)


def database_url(postgres_conn_id: str) -> str:
    """A libpq URL for the connection, password included (the hook's URI names a SQLAlchemy
    driver). It reaches processes in their environment, never on a command line."""
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql://",
                  PostgresHook(postgres_conn_id=postgres_conn_id).get_uri())


def spark_connect_url(conn_id: str) -> str | None:
    """The Spark Connect server's URL (`sc://...`, its token included) as the provider's hook
    builds it from a `spark_connect` connection; None when there is no such connection."""
    try:
        return SparkConnectHook(conn_id).get_connection_url()
    except AirflowNotFoundException:
        return None


def base_url(conn_id: str) -> str:
    """An HTTP connection's base URL (its schema is the scheme, as for the HTTP provider's hook)."""
    conn = BaseHook.get_connection(conn_id)
    return f"{conn.schema or 'http'}://{conn.host}" + (f":{conn.port}" if conn.port else "")


def endpoint_urls(spec: PipelineSpec) -> dict[str, str]:
    """Each AI endpoint of the spec: its Airflow connection's base URL, and its path."""
    return {name: base_url(e.connection) + e.path for name, e in spec.endpoints.items()}


def endpoint_keys(spec: PipelineSpec) -> dict[str, str]:
    """Each AI endpoint's key: its Airflow connection's password, when it has one."""
    passwords = {conn_id: BaseHook.get_connection(conn_id).password
                 for conn_id in {e.connection for e in spec.endpoints.values()}}
    return {name: password for name, e in spec.endpoints.items() if (password := passwords[e.connection])}


def stand_in_endpoints(spec: PipelineSpec) -> dict[str, list[str]]:
    """The base URL of each connection of the spec's endpoints that says it is the AI stand-in
    (extra `stand_in`), with the endpoints it serves; a real API's connection is never listed."""
    served: dict[str, list[str]] = {}
    for name, endpoint in spec.endpoints.items():
        extra = BaseHook.get_connection(endpoint.connection).extra_dejson
        if str(extra.get("stand_in", "")).lower() == "true":
            served.setdefault(base_url(endpoint.connection), []).append(name)
    return served


@contextmanager
def transaction(hook: PostgresHook) -> Iterator[Any]:
    """A cursor in one transaction on a fresh connection of `hook`, closed afterwards (a
    connection's own context manager commits but does not close it)."""
    conn = hook.get_conn()
    try:
        with conn, conn.cursor() as cur:
            yield cur
    finally:
        conn.close()
