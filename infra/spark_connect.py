"""The stack's Spark Connect server: one long-lived Spark application in whose sessions the DAGs'
analyses run, instead of each starting and warming a JVM of its own (docs/analysis.md, "Spark
start-up per tuning run").

It is started with spark-submit's launcher and class `SparkConnectServer` (the PySpark wheel
holds its jar, not the start script), with the stack's Spark configuration folder: the connector
jars, the project's Python for any Python worker, and the stack's master, `local[*]` or the
standalone master. There, dynamic allocation lets an idle executor go, so the server holds the
worker's cores only while it works and the applications spark-submit sends to the master (the
tests, a DAG run where the connection is not defined) do not wait for it.

Clients authenticate with a token, which the server reads from its environment so that it never
shows on a command line. The URL carrying it, `sc://localhost:<port>/;token=...`, is in stack.env
(`SPARK_CONNECT_URL`) and in the `spark_connect` connection: `localhost`, because PySpark's
client sends a token without TLS only to localhost. The server logs warnings only (LOG_CONFIG):
at INFO it logs every execution's plan with its options, the JDBC and Kafka passwords included.
"""

from __future__ import annotations

import sys
from pathlib import Path

from host.processes import alive, spawn, tail, terminate
from infra import spark_cluster
from infra.layout import Layout, wait_for_port
from spark.session import QUICK_JIT, server_conf

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"  # the server's own variable for its token
# On the standalone master: an executor idle this long, with shuffle files or cached blocks or
# neither, is let go. Each analysis's queries and caches are its own, so nothing reads an earlier
# one's again.
IDLE_EXECUTOR = "30s"
RELEASING_CORES = {
    "spark.dynamicAllocation.enabled": "true",
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",  # no external shuffle service here
    "spark.dynamicAllocation.executorIdleTimeout": IDLE_EXECUTOR,
    "spark.dynamicAllocation.shuffleTracking.timeout": IDLE_EXECUTOR,
    "spark.dynamicAllocation.cachedExecutorIdleTimeout": IDLE_EXECUTOR,
}


# The server's own start line stays, for its log to say when it listened.
LOG_CONFIG = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.server.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.server.level = info
"""


def url(layout: Layout, token: str) -> str:
    return f"sc://localhost:{layout.spark_connect_port}/;token={token}"


def token_of(connect_url: str) -> str | None:
    """The token a URL of `url` carries."""
    params = dict(p.split("=", 1) for p in connect_url.partition("/;")[2].split(";") if "=" in p)
    return params.get("token")


def connection(layout: Layout, token: str) -> dict:
    """The Airflow connection (the Spark provider's `spark_connect` type, the token as its password)."""
    return {"conn_type": "spark_connect", "host": "localhost", "port": layout.spark_connect_port,
            "password": token}


def log_file(layout: Layout) -> Path:
    return spark_cluster.folder(layout) / "logs" / "connect.log"


def log_config(layout: Layout) -> Path:
    return spark_cluster.conf_dir(layout) / "connect-log4j2.properties"


APP_NAME = "spark-connect"  # the server's application on the master

def command(layout: Layout, master: str) -> list[str]:
    conf = {**server_conf(), "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(layout.spark_connect_port),
            **(RELEASING_CORES if master.startswith("spark://") else {})}
    return [str(Path(sys.executable).parent / "spark-submit"), "--class", SERVER_CLASS,
            "--name", APP_NAME, "--master", master,
            "--driver-java-options", f"{QUICK_JIT} -Dlog4j2.configurationFile={log_config(layout)}",
            *(arg for name, value in conf.items() for arg in ("--conf", f"{name}={value}"))]


def start(layout: Layout, master: str, token: str, timeout_s: float = 120.0) -> int:
    """Start the server on `master`; return its pid once it listens."""
    log_config(layout).write_text(LOG_CONFIG)
    pid = spawn(command(layout, master), log_file(layout),
                env={**spark_cluster.environment(layout), TOKEN_ENV: token})
    if not wait_for_port(layout.spark_connect_port, timeout_s) or not alive(pid):
        terminate(pid, grace_s=10)
        raise RuntimeError(f"the Spark Connect server did not start:\n{tail(log_file(layout))}")
    return pid


def stop(pid: int | None) -> None:
    terminate(pid, grace_s=20.0)
