"""How the platform reaches a Kafka cluster, and as whom.

A connection is one principal's librdkafka client settings: `bootstrap.servers` plus whatever
the cluster asks for (`security.protocol`, `sasl.*`, `ssl.*`). Every Kafka client of the
platform starts from one: producers and consumers add their profile's settings to it, admin
clients use it as it is, Spark's Kafka source gets it translated to the Java client's names.
Nothing else passes addresses around, so a setting in the connection reaches every client.

On a secured cluster each role runs as a principal of its own (the load source, each stage's
fleet), so that ACLs can hold it to its own topics and group; `KafkaAccess` keeps them, and a
role without its own principal uses the default one (the admin, which provisions).

Processes receive a connection in their environment, never on the command line:
`KAFKA_CLIENT_CONFIG` (JSON), or the plain `KAFKA_BOOTSTRAP_SERVERS` on an open cluster, and
`KAFKA_CLIENT_CONFIG_<ROLE>` for a role's own principal. `repr` hides secret values, so a
connection in a log line or an exception shows no password.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ENV = "KAFKA_CLIENT_CONFIG"
BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
HIDDEN = "***"
# What a connection is made of; anything else in a client configuration (group.id, offsets,
# batching) belongs to the client or its profile, not to the cluster.
_CONNECTION_SETTINGS = ("bootstrap.servers", "security.protocol", "client.id")
_CONNECTION_PREFIXES = ("sasl.", "ssl.")

# librdkafka settings that hold secrets (matched as a substring of the name).
_SECRET_MARKERS = ("password", "secret", "sasl.oauthbearer.config", "ssl.key.pem", "ssl_key")
# SASL mechanisms -> the Java login module Spark's Kafka source needs for them.
_LOGIN_MODULES = {
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
}
# librdkafka names the Java client spells the same way.
_SAME_IN_JAVA = ("bootstrap.servers", "security.protocol", "ssl.endpoint.identification.algorithm",
                 "client.id")


def role_env(role: str) -> str:
    """The variable holding a role's own connection."""
    return f"{ENV}_{role.upper()}"


def is_secret(name: str) -> bool:
    return any(marker in name for marker in _SECRET_MARKERS)


@dataclass(frozen=True, repr=False)
class KafkaConnection:
    """One principal's client settings for one cluster."""

    settings: Mapping[str, Any]

    def __post_init__(self) -> None:
        if not self.settings.get("bootstrap.servers"):
            raise ValueError("a Kafka connection needs bootstrap.servers")

    @classmethod
    def plain(cls, bootstrap: str) -> KafkaConnection:
        """An open (PLAINTEXT) cluster: the bootstrap list is all there is."""
        return cls({"bootstrap.servers": bootstrap})

    @classmethod
    def from_client_config(cls, config: Mapping[str, Any]) -> KafkaConnection:
        """The connection part of a client configuration (such as an Airflow Kafka connection's
        extra, which also carries a consumer's `group.id`)."""
        return cls({k: v for k, v in config.items()
                    if k in _CONNECTION_SETTINGS or k.startswith(_CONNECTION_PREFIXES)})

    @property
    def bootstrap(self) -> str:
        return str(self.settings["bootstrap.servers"])

    @property
    def principal(self) -> str | None:
        """The principal ACLs name (`User:<name>`), when the connection authenticates."""
        user = self.settings.get("sasl.username")
        return f"User:{user}" if user else None

    def client(self, **settings: Any) -> dict[str, Any]:
        """Settings for a librdkafka client: the connection's, then the caller's."""
        return {**self.settings, **settings}

    def admin(self) -> Any:
        """An AdminClient as this principal."""
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.client())

    def partition_counts(self, topic: str) -> list[int]:
        """Records per partition of a topic (in partition order), from its low and high
        watermarks: what a reader of the whole topic would get, without reading it. Partitions
        nobody wrote to count as 0; a topic the cluster does not have raises LookupError."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(self.client(**{"group.id": "partition-counts"}))
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            if meta.error is not None:
                raise LookupError(f"topic {topic}: {meta.error.str()}")
            counts = []
            for pid in sorted(meta.partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, pid), timeout=10)
                counts.append(high - low)
            return counts
        finally:
            consumer.close()

    def spark_options(self) -> dict[str, str]:
        """The `kafka.`-prefixed options of Spark's Kafka source for this connection.

        The Java client names most settings as librdkafka does; SASL credentials become a JAAS
        line and a PEM CA file a PEM truststore. A setting with no Java counterpart is refused
        rather than dropped, since dropping one is how a secured connection silently fails.
        """
        s = self.settings
        options = {f"kafka.{name}": str(s[name]) for name in _SAME_IN_JAVA if name in s}
        mechanism = s.get("sasl.mechanism") or s.get("sasl.mechanisms")
        if mechanism:
            if mechanism not in _LOGIN_MODULES:
                raise ValueError(f"SASL mechanism {mechanism!r} has no Java login module here; "
                                 f"known: {', '.join(_LOGIN_MODULES)}")
            options["kafka.sasl.mechanism"] = mechanism
            options["kafka.sasl.jaas.config"] = (
                f"{_LOGIN_MODULES[mechanism]} required "
                f"username={_jaas_quote(s['sasl.username'])} password={_jaas_quote(s['sasl.password'])};")
        if "ssl.ca.location" in s:
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = str(s["ssl.ca.location"])
        handled = {*_SAME_IN_JAVA, "sasl.mechanism", "sasl.mechanisms", "sasl.username",
                   "sasl.password", "ssl.ca.location"}
        unknown = sorted(set(s) - handled)
        if unknown:
            raise ValueError(f"no Spark Kafka option for connection settings {unknown}")
        return options

    def environment(self) -> dict[str, str]:
        """The variables that hand this connection to a child process."""
        return {ENV: json.dumps(dict(self.settings), sort_keys=True), BOOTSTRAP_ENV: self.bootstrap}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None,
                         variable: str = ENV) -> KafkaConnection | None:
        """The connection in `variable` (JSON), else the plain bootstrap list, else None."""
        env = os.environ if environ is None else environ
        if env.get(variable):
            return cls(json.loads(env[variable]))
        if variable == ENV and env.get(BOOTSTRAP_ENV):
            return cls.plain(env[BOOTSTRAP_ENV])
        return None

    def child_environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) with this connection as the only one:
        a child running as one principal gets no other principal's secrets."""
        env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(ENV)}
        return {**env, **self.environment()}

    def redacted(self) -> dict[str, Any]:
        return {k: HIDDEN if is_secret(k) else v for k, v in self.settings.items()}

    def __repr__(self) -> str:
        return f"KafkaConnection({self.redacted()})"


def add_argument(parser: argparse.ArgumentParser) -> None:
    """The `--bootstrap-servers` option of the platform's commands."""
    parser.add_argument("--bootstrap-servers",
                        help=f"an open cluster's bootstrap list (default: the connection in ${ENV}, "
                             f"else ${BOOTSTRAP_ENV})")


def from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> KafkaAccess:
    """The access a command was given: `--bootstrap-servers`, else its environment."""
    if args.bootstrap_servers:
        return KafkaAccess.plain(args.bootstrap_servers)
    access = KafkaAccess.from_environment()
    if access is None:
        parser.error(f"no Kafka: pass --bootstrap-servers or set {ENV} or {BOOTSTRAP_ENV} "
                     "(source .local/stack.env)")
    return access


def _jaas_quote(value: str) -> str:
    """A JAAS option value: a double-quoted string with `\\` and `"` escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class KafkaAccess:
    """The principals a pipeline runs under: a default one, and the roles that have their own."""

    default: KafkaConnection
    roles: Mapping[str, KafkaConnection] = field(default_factory=dict)

    @classmethod
    def plain(cls, bootstrap: str) -> KafkaAccess:
        return cls(KafkaConnection.plain(bootstrap))

    def of(self, role: str) -> KafkaConnection:
        """The connection `role` runs as."""
        return self.roles.get(role, self.default)

    @property
    def bootstrap(self) -> str:
        return self.default.bootstrap

    def grantees(self) -> dict[str, str]:
        """role -> principal, for the roles whose principal is not the default one's."""
        default = self.default.principal
        return {role: conn.principal for role, conn in self.roles.items()
                if conn.principal and conn.principal != default}

    def environment(self) -> dict[str, str]:
        """The variables that hand the whole access (every role) to a process."""
        env = self.default.environment()
        for role, conn in self.roles.items():
            env[role_env(role)] = conn.environment()[ENV]
        return env

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> KafkaAccess | None:
        default = KafkaConnection.from_environment(environ)
        if default is None:
            return None
        environ = os.environ if environ is None else environ
        prefix = f"{ENV}_"
        roles = {name.removeprefix(prefix).lower(): conn for name in environ if name.startswith(prefix)
                 if (conn := KafkaConnection.from_environment(environ, name)) is not None}
        return cls(default, roles)

    def __repr__(self) -> str:
        return f"KafkaAccess(default={self.default!r}, roles={dict(self.roles)!r})"
