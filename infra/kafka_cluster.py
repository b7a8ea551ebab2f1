"""Apache Kafka in KRaft mode from the jars Maven put in the cache.

Every node is a combined broker+controller on loopback with a static controller quorum, so
one node or three come up the same way. Settings here speed up tests on the local stack only
(no initial rebalance delay, short minimum session timeouts, replication factors capped at the
node count); production settings live in the configuration profiles.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient

from infra.layout import KAFKA_JARS, REPO, Layout, port_in_use
from infra.processes import alive, spawn, tail, terminate

LOG4J_CONFIG = REPO / "infra" / "kafka" / "log4j2.properties"
HEAP = "-Xmx768m"


def node_dir(layout: Layout, node_id: int) -> Path:
    return layout.root / f"kafka-{node_id}"


def server_properties(layout: Layout, node_id: int, nodes: int) -> str:
    """The broker's server.properties for a cluster of `nodes` on loopback."""
    voters = ",".join(f"{i}@127.0.0.1:{layout.controller_port(i)}" for i in range(1, nodes + 1))
    replicas = min(3, nodes)
    min_isr = min(2, nodes)
    settings = {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{layout.kafka_port(node_id)},"
                     f"CONTROLLER://127.0.0.1:{layout.controller_port(node_id)}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{layout.kafka_port(node_id)}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": node_dir(layout, node_id) / "data",
        "auto.create.topics.enable": "false",
        "num.partitions": 1,
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": 10,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        # Local-stack only: fast group formation and short timeouts for scaled-down tests.
        "group.initial.rebalance.delay.ms": 0,
        "group.min.session.timeout.ms": 500,
        "group.consumer.min.session.timeout.ms": 500,
        "group.consumer.min.heartbeat.interval.ms": 100,
        "group.consumer.heartbeat.interval.ms": 500,
        "group.consumer.session.timeout.ms": 6000,
        "log.retention.hours": 24,
        "log.segment.bytes": 64 * 1024 * 1024,
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def java_command(main_class: str, *args: str, logs_dir: Path | None = None) -> list[str]:
    """A `java` command line running `main_class` from the Kafka jar cache."""
    if not any(KAFKA_JARS.glob("kafka_2.13-*.jar")):
        raise RuntimeError(f"Kafka jars missing in {KAFKA_JARS}: run `make jars`")
    props = [f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"]
    if logs_dir is not None:
        props.append(f"-Dkafka.logs.dir={logs_dir}")
    return ["java", HEAP, "-XX:+UseG1GC", *props, "-cp", f"{KAFKA_JARS}/*", main_class, *args]


def format_storage(layout: Layout, node_id: int, nodes: int, cluster_id: str) -> Path:
    """Write server.properties and format the node's KRaft log directory (once)."""
    directory = node_dir(layout, node_id)
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "server.properties"
    config.write_text(server_properties(layout, node_id, nodes))
    if not (directory / "data" / "meta.properties").exists():
        subprocess.run(
            java_command("kafka.tools.StorageTool", "format", "--cluster-id", cluster_id,
                         "--config", str(config), "--ignore-formatted",
                         logs_dir=directory / "logs"),
            check=True, capture_output=True, text=True,
        )
    return config


def start_node(layout: Layout, node_id: int) -> int:
    """Start one formatted node; return its pid."""
    directory = node_dir(layout, node_id)
    return spawn(
        java_command("kafka.Kafka", str(directory / "server.properties"),
                     logs_dir=directory / "logs"),
        directory / "logs" / "stdout.log",
    )


def new_cluster_id() -> str:
    """A KRaft cluster id: a UUID in Kafka's URL-safe base64 form."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def wait_registered(layout: Layout, pids: dict[int, int], expected: int,
                    timeout_s: float = 90.0) -> None:
    """Block until `expected` brokers are registered, or fail with the broker logs."""
    admin = None
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        for node_id, pid in pids.items():
            if not alive(pid):
                log = node_dir(layout, node_id) / "logs" / "server.log"
                raise RuntimeError(f"Kafka node {node_id} exited during start-up:\n{tail(log)}")
        listening = [n for n in pids if port_in_use(layout.kafka_port(n))]
        if listening and admin is None:
            admin = AdminClient({"bootstrap.servers": layout.bootstrap_servers(max(pids)),
                                 "log_level": 0})
        if admin is not None:
            try:
                seen = len(admin.describe_cluster(request_timeout=5).result().nodes)
            except Exception:  # noqa: BLE001 - the cluster is still electing
                seen = 0
        if seen >= expected:
            return
        time.sleep(0.5)
    raise RuntimeError(f"only {seen} of {expected} Kafka brokers registered in {timeout_s:.0f}s")


def stop_node(pid: int | None) -> None:
    """Controlled shutdown on SIGTERM; the grace period covers leader migration."""
    terminate(pid, grace_s=30.0)
