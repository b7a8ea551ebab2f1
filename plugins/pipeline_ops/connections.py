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
from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow.sdk import BaseHook

from consumers.kafka_connection import KafkaAccess, KafkaConnection
from consumers.pipeline_spec import roles


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
