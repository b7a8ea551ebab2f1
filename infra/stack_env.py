"""What the local stack tells its clients: the passwords it keeps (`Credentials`), and the
addresses, credentials and Airflow connections `stack.env` holds (`environment`, `write_env`),
each connection set once."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from consumers.config.kafka_connection import KafkaAccess, KafkaConnection
from consumers.config.pipeline_spec import roles
from host.files import write_private
from infra import ai_gateway, kafka_cluster, spark_cluster, spark_connect, tls
from infra.layout import LOCAL, PLAINTEXT, REPO, SASL_SSL, Layout
from infra.supervisor import stack_paths
from spark.jars import resolved_jars


@dataclass(frozen=True, repr=False)
class Credentials:
    """The stack's passwords: PostgreSQL's superuser's, on a secured stack each Kafka
    principal's (`admin` and one per role, named like the role), with a gateway its master key,
    and the Spark Connect server's token."""

    postgres: str | None
    kafka: Mapping[str, str]
    gateway: str | None = None
    spark_connect: str | None = None

    @classmethod
    def saved(cls, layout: Layout) -> Credentials:
        """The passwords the stack's stack.env holds (none before the first start)."""
        access = KafkaAccess.from_environment(layout.saved_env())
        connections = [access.default, *access.roles.values()] if access else []
        connect_url = layout.saved_env().get("SPARK_CONNECT_URL")
        return cls(layout.postgres_password(),
                   {c.settings["sasl.username"]: c.settings["sasl.password"]
                    for c in connections if "sasl.username" in c.settings},
                   layout.saved_env().get("AI_GATEWAY_KEY"),
                   spark_connect.token_of(connect_url) if connect_url else None)

    def completed(self, security: str, gateway: str = ai_gateway.NONE) -> Credentials:
        """These passwords, with new ones for what `security` and `gateway` need and they lack
        (a stack without a gateway keeps no key for one)."""
        users = (kafka_cluster.ADMIN, *roles()) if security == SASL_SSL else ()
        key = (self.gateway or ai_gateway.new_key(new_password())) if gateway == ai_gateway.LITELLM else None
        return Credentials(self.postgres or new_password(),
                           {user: self.kafka.get(user) or new_password() for user in users}, key,
                           self.spark_connect or new_password())


def new_password() -> str:
    """A random password of URL-safe characters (none needs escaping in a URL, JAAS or shell)."""
    return secrets.token_urlsafe(24)


def kafka_access(layout: Layout, brokers: int, security: str, credentials: Credentials) -> KafkaAccess:
    """Who reaches the stack's Kafka as whom: on a secured stack the admin by default and each
    role as its own SCRAM user, over TLS checked against the stack's CA."""
    bootstrap = layout.bootstrap_servers(brokers)
    if security == PLAINTEXT:
        return KafkaAccess.plain(bootstrap)
    ca = tls.TlsFiles(layout.tls_dir).ca

    def connection(user: str) -> KafkaConnection:
        return KafkaConnection({"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL",
                                "sasl.mechanism": kafka_cluster.SCRAM, "sasl.username": user,
                                "sasl.password": credentials.kafka[user], "ssl.ca.location": str(ca)})

    return KafkaAccess(connection(kafka_cluster.ADMIN), {role: connection(role) for role in roles()})


def airflow_kafka_connections(access: KafkaAccess) -> dict[str, str]:
    """`kafka_default` as the default principal, `kafka_default_<role>` for each role that has
    its own, and `kafka_dead_letter_watch` (the default principal) for the dead-letter watcher."""
    default = {**access.default.settings, "group.id": "airflow", "auto.offset.reset": "earliest"}
    conns = {"AIRFLOW_CONN_KAFKA_DEFAULT": {"conn_type": "kafka", "extra": default}}
    # The dead-letter watcher's own group: its trigger commits only once an event is stored
    # (plugins/pipeline_ops/dead_letter_watch.py says why each setting).
    conns["AIRFLOW_CONN_KAFKA_DEAD_LETTER_WATCH"] = {"conn_type": "kafka", "extra": {
        **access.default.settings, "group.id": "dead_letter_triage", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 10000}}
    for role, conn in access.roles.items():
        conns[f"AIRFLOW_CONN_KAFKA_DEFAULT_{role.upper()}"] = {"conn_type": "kafka",
                                                               "extra": dict(conn.settings)}
    return {name: json.dumps(conn) for name, conn in conns.items()}


def spark_connection(layout: Layout, spark: str) -> dict:
    """`spark_default`: the standalone master in client deploy mode, or local[*]."""
    if spark == spark_cluster.CLUSTER:
        return {"conn_type": "spark", "host": "spark://127.0.0.1", "port": layout.spark_master_port,
                "extra": {"deploy-mode": "client"}}
    return {"conn_type": "spark", "host": "local[*]"}


def spark_connect_environment(layout: Layout, token: str | None) -> dict[str, str]:
    """The Connect server's URL, token included, and the `spark_connect_default` connection.
    Not PySpark's own SPARK_REMOTE: with it set, every session PySpark builds, spark-submit's
    included, would be a client of the server."""
    if token is None:
        return {}
    return {"SPARK_CONNECT_URL": spark_connect.url(layout, token),
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps(spark_connect.connection(layout, token))}


def gateway_connection(layout: Layout, key: str) -> str:
    """The gateway as an Airflow connection: HTTP, its master key as the password."""
    return json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": layout.ai_gateway_port,
                       "password": key})


def llm_connection(layout: Layout, gateway_key: str | None) -> str:
    """The `llm` connection the LLM pipeline's OpenAI-compatible models name: the stand-in serves
    them, or the gateway in front of it when there is one."""
    if gateway_key is None:
        return f"http://127.0.0.1:{layout.ai_service_port}/?stand_in=true"
    return gateway_connection(layout, gateway_key)


def gateway_environment(layout: Layout, key: str | None) -> dict[str, str]:
    """With a gateway (`key` its master key): its URL and key, and the `ai_gateway` connection
    for the endpoints of a spec that name it."""
    if key is None:
        return {}
    return {"AI_GATEWAY_URL": f"http://127.0.0.1:{layout.ai_gateway_port}", "AI_GATEWAY_KEY": key,
            "AIRFLOW_CONN_AI_GATEWAY": gateway_connection(layout, key)}


def environment(layout: Layout, brokers: int, security: str, credentials: Credentials,
                spark: str) -> dict[str, str]:
    """The stack's addresses and credentials, and the Airflow settings that point at them."""
    access = kafka_access(layout, brokers, security, credentials)
    database_url = layout.database_url(password=credentials.postgres)
    airflow_db = layout.database_url("airflow", credentials.postgres).replace(
        "postgresql://", "postgresql+psycopg2://")
    return {
        "STACK": layout.name,
        "SECURITY": security,
        "KAFKA_BROKERS": str(brokers),
        **access.environment(),  # KAFKA_CLIENT_CONFIG, KAFKA_BOOTSTRAP_SERVERS, ..._<ROLE>
        "DATABASE_URL": database_url,
        "AI_SERVICE_URL": f"http://127.0.0.1:{layout.ai_service_port}",
        "SUPERVISOR_URL": stack_paths(layout).url,
        "SPARK": spark,
        "SPARK_CONF_DIR": str(spark_cluster.conf_dir(layout)),
        "SPARK_JARS": resolved_jars(),
        "AIRFLOW_HOME": str(layout.root / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE":
            str(layout.root / "airflow" / "passwords.json"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db,
        "AIRFLOW__API__PORT": str(layout.airflow_port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{layout.airflow_port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL":
            f"http://127.0.0.1:{layout.airflow_port}/execution/",
        **airflow_kafka_connections(access),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": database_url.replace("postgresql://", "postgres://"),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark_connection(layout, spark)),
        **spark_connect_environment(layout, credentials.spark_connect),
        "AIRFLOW_CONN_AI_SERVICE": f"http://127.0.0.1:{layout.ai_service_port}/?stand_in=true",
        "AIRFLOW_CONN_LLM": llm_connection(layout, credentials.gateway),
        **gateway_environment(layout, credentials.gateway),
        "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}",
        # spark-submit and the fleet commands come from the project's environment.
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }


def write_env(layout: Layout, env: dict[str, str]) -> None:
    """stack.env, owner-only: it holds the stack's passwords."""
    text = "".join(f"{key}={shlex.quote(value)}\n" for key, value in env.items())
    write_private(layout.env_file, text)
    if layout.name == "dev":
        write_private(LOCAL / "stack.env", text)
