"""Apache Kafka in KRaft mode from the jars Maven put in the cache.

Every node is a combined broker+controller on loopback with a static controller quorum, so
one node or three come up the same way. Settings here speed up tests on the local stack only
(no initial rebalance delay, short minimum session timeouts, replication factors capped at the
node count); production settings live in the configuration profiles.

A secured (`sasl_ssl`) cluster serves clients and the other brokers on a SASL_SSL listener with
SCRAM-SHA-512 users, created when the storage is formatted, and authorizes every request with
ACLs (none until someone grants them; `admin` is the super user and the brokers' own
identity). The controller listener stays on loopback without TLS but authenticates with
SASL/PLAIN as `admin`, so no unauthenticated connection is accepted anywhere and the anonymous
user needs no rights. Files holding passwords are owner-only, and passwords never appear on a
command line.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from consumers.config.kafka_connection import KafkaConnection
from host.files import write_private
from host.processes import alive, spawn, tail, terminate
from infra.layout import KAFKA_JARS, REPO, Layout, port_in_use
from infra.tls import TlsFiles

LOG4J_CONFIG = REPO / "infra" / "kafka" / "log4j2.properties"
HEAP = "-Xmx768m"
# The brokers collect with ZGC: G1's young pauses held every produce and fetch in flight, and
# held to shorter pauses it paused more often (docs/design.md#the-brokers-collect-garbage-with-zgc).
# The tools keep G1.
BROKER_GC = "-XX:+UseZGC"
TOOL_GC = "-XX:+UseG1GC"
ADMIN = "admin"  # the super user: provisions topics and ACLs, and is the brokers' own identity
SCRAM = "SCRAM-SHA-512"
_LOGIN_MODULES = {"SCRAM": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule"}


@dataclass(frozen=True, repr=False)
class Secured:
    """What a SASL_SSL cluster needs: its SCRAM users (name -> password, `admin` among them)
    and its TLS files."""

    users: Mapping[str, str]
    tls: TlsFiles

    @property
    def admin_password(self) -> str:
        return self.users[ADMIN]


def node_dir(layout: Layout, node_id: int) -> Path:
    return layout.root / f"kafka-{node_id}"


# Development stacks only (this one and docker-compose.yaml's brokers, checked by a test): groups
# form at once, and the session timeouts the presets scale down with the time scale are allowed.
GROUP_SETTINGS = {
    "group.initial.rebalance.delay.ms": 0,
    "group.min.session.timeout.ms": 500,
    "group.consumer.min.session.timeout.ms": 500,
    "group.consumer.min.heartbeat.interval.ms": 100,
    "group.consumer.heartbeat.interval.ms": 500,
    "group.consumer.session.timeout.ms": 6000,
}


def server_properties(layout: Layout, node_id: int, nodes: int, secured: Secured | None = None) -> str:
    """The broker's server.properties for a cluster of `nodes` on loopback, SASL_SSL when
    `secured`."""
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
        **GROUP_SETTINGS,
        "log.retention.hours": 24,
        "log.segment.bytes": 64 * 1024 * 1024,
        # A deleted topic's files go a second later, while its run is cleaning up. After the
        # default minute, the files of one benchmark scenario's 320 partitions were deleted in
        # the first seconds of the next scenario's burst (a minute is about a scenario's length).
        # The broker's name for it: `file.delete.delay.ms` is the topic-level one, which a broker
        # takes for an unknown setting and ignores.
        "log.segment.delete.delay.ms": 1000,
    }
    if secured is not None:
        settings.update(_secured_settings(layout, node_id, secured))
    return properties(settings)


def _secured_settings(layout: Layout, node_id: int, secured: Secured) -> dict[str, object]:
    """The listeners, SASL, TLS and authorizer settings of a SASL_SSL node."""
    port, controller_port = layout.kafka_port(node_id), layout.controller_port(node_id)
    password = secured.admin_password
    return {
        "listeners": f"SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"SASL_SSL://127.0.0.1:{port}",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": SCRAM,
        "sasl.mechanism.inter.broker.protocol": SCRAM,
        f"listener.name.sasl_ssl.{SCRAM.lower()}.sasl.jaas.config":
            _jaas("SCRAM", username=ADMIN, password=password),
        # The controller listener checks PLAIN logins against the `user_<name>` options; every
        # node logs in to the others (and its broker to the controllers) as admin.
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config":
            _jaas("PLAIN", username=ADMIN, password=password, **{f"user_{ADMIN}": password}),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": secured.tls.keystore,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": secured.tls.ca,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{ADMIN}",
        "allow.everyone.if.no.acl.found": "false",
    }


def _jaas(mechanism: str, **options: str) -> str:
    """A broker-side JAAS line: the login module and its options."""
    quoted = " ".join(f"{name}={_quote(value)}" for name, value in options.items())
    return f"{_LOGIN_MODULES[mechanism]} required {quoted};"


def _quote(value: str) -> str:
    """A double-quoted string with backslash escapes, as JAAS and Java argument files read it."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def properties(settings: Mapping[str, object]) -> str:
    """A Java properties file (backslash is its escape character)."""
    lines = (f"{key}={value}" for key, value in settings.items())
    return "".join(line.replace("\\", "\\\\") + "\n" for line in lines)


def java_command(main_class: str, *args: str, logs_dir: Path | None = None,
                 collector: str = TOOL_GC) -> list[str]:
    """A `java` command line running `main_class` from the Kafka jar cache (or `@file`: a Java
    argument file holding the main class and its arguments)."""
    if not any(KAFKA_JARS.glob("kafka_2.13-*.jar")):
        raise RuntimeError(f"Kafka jars missing in {KAFKA_JARS}: run `make jars`")
    props = [f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"]
    if logs_dir is not None:
        props.append(f"-Dkafka.logs.dir={logs_dir}")
    return ["java", HEAP, collector, *props, "-cp", f"{KAFKA_JARS}/*", main_class, *args]


def format_storage(layout: Layout, node_id: int, nodes: int, cluster_id: str,
                   secured: Secured | None = None) -> Path:
    """Write server.properties (owner-only: it holds the admin's password on a secured cluster)
    and format the node's KRaft log directory (once), with the SCRAM users when `secured`."""
    directory = node_dir(layout, node_id)
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "server.properties"
    write_private(config, server_properties(layout, node_id, nodes, secured))
    if not (directory / "data" / "meta.properties").exists():
        args = ["format", "--cluster-id", cluster_id, "--config", str(config), "--ignore-formatted"]
        for user, password in (secured.users.items() if secured else ()):
            args += ["--add-scram", f"{SCRAM}=[name={user},password={password}]"]
        _run_privately("kafka.tools.StorageTool", args, logs_dir=directory / "logs")
    return config


def _run_privately(main_class: str, args: list[str], logs_dir: Path) -> None:
    """Run a Kafka tool with its main class and arguments in a Java argument file (owner-only,
    removed afterwards), so that passwords among them never show in the process list."""
    fd, path = tempfile.mkstemp(prefix="kafka-args-", dir=logs_dir.parent)
    try:
        with os.fdopen(fd, "w") as file:
            file.writelines(f"{_quote(arg)}\n" for arg in (main_class, *args))
        done = subprocess.run(java_command(f"@{path}", logs_dir=logs_dir),
                              check=False, capture_output=True, text=True)
        if done.returncode != 0:  # the tool says why on its own output (passwords masked)
            said = re.sub(r"password=[^,\]\s]*", "password=***", (done.stderr or done.stdout).strip())
            raise RuntimeError(f"{main_class} {args[0] if args else ''} failed with exit code "
                               f"{done.returncode}: {said[-2000:]}")
    finally:
        os.unlink(path)


def start_node(layout: Layout, node_id: int) -> int:
    """Start one formatted node; return its pid."""
    directory = node_dir(layout, node_id)
    return spawn(
        java_command("kafka.Kafka", str(directory / "server.properties"),
                     logs_dir=directory / "logs", collector=BROKER_GC),
        directory / "logs" / "stdout.log",
    )


def new_cluster_id() -> str:
    """A KRaft cluster id: a UUID in Kafka's URL-safe base64 form, never starting with '-' (as
    Kafka's own Uuid.randomUuid ensures): the storage tool reads such an id as an option and
    refuses to format, one stack start in 64."""
    import base64

    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


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
            admin = AdminClient(admin_connection(layout, max(pids)).client(log_level=0))
        if admin is not None:
            try:
                seen = len(admin.describe_cluster(request_timeout=5).result().nodes)
            except Exception:  # noqa: BLE001 - the cluster is still electing
                seen = 0
        if seen >= expected:
            return
        time.sleep(0.5)
    raise RuntimeError(f"only {seen} of {expected} Kafka brokers registered in {timeout_s:.0f}s")


def admin_connection(layout: Layout, nodes: int) -> KafkaConnection:
    """The admin's connection as the stack's stack.env holds it (which `up` writes before it
    starts anything), or the plain bootstrap list before there is one."""
    return (KafkaConnection.from_environment(layout.saved_env())
            or KafkaConnection.plain(layout.bootstrap_servers(nodes)))


def stop_nodes(*pids: int | None) -> None:
    """Controlled shutdown on SIGTERM, every node at once (see `terminate`); the grace period
    covers leader migration."""
    terminate(*pids, grace_s=30.0)
