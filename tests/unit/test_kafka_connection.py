"""A connection's settings reach every client, Spark gets them in the Java client's words,
child processes get exactly one principal, and nothing prints a secret."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from consumers.config import pipeline_spec
from consumers.config.events import Topics
from consumers.config.kafka_connection import KafkaAccess, KafkaConnection
from consumers.kafka_clients import acls

SECURED = {"bootstrap.servers": "127.0.0.1:39092", "security.protocol": "SASL_SSL",
           "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin", "sasl.password": 'p"w\\1',
           "ssl.ca.location": "/tls/ca.pem"}


def role(name: str) -> KafkaConnection:
    return KafkaConnection({**SECURED, "sasl.username": name, "sasl.password": f"{name}-secret"})


def test_spark_options_are_the_java_clients_names() -> None:
    assert KafkaConnection(SECURED).spark_options() == {
        "kafka.bootstrap.servers": "127.0.0.1:39092",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="admin" password="p\\"w\\\\1";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/tls/ca.pem",
    }
    assert KafkaConnection.plain("h:1").spark_options() == {"kafka.bootstrap.servers": "h:1"}


def test_a_setting_spark_cannot_take_is_refused_not_dropped() -> None:
    with pytest.raises(ValueError, match=r"ssl.certificate.location"):
        KafkaConnection({**SECURED, "ssl.certificate.location": "/c.pem"}).spark_options()
    with pytest.raises(ValueError, match="GSSAPI"):
        KafkaConnection({**SECURED, "sasl.mechanism": "GSSAPI"}).spark_options()


def test_an_airflow_extra_keeps_only_the_connection() -> None:
    extra = {**SECURED, "group.id": "airflow", "auto.offset.reset": "earliest"}
    assert dict(KafkaConnection.from_client_config(extra).settings) == SECURED
    with pytest.raises(ValueError, match=r"bootstrap.servers"):
        KafkaConnection.from_client_config({"group.id": "g"})


def test_repr_hides_secrets() -> None:
    access = KafkaAccess(KafkaConnection(SECURED), {"check": role("check")})
    shown = repr(access)
    assert 'p"w' not in shown and "check-secret" not in shown
    assert "***" in shown and "SCRAM-SHA-512" in shown


def test_environment_round_trip_and_roles() -> None:
    access = KafkaAccess(KafkaConnection(SECURED), {"check": role("check"), "source": role("source")})
    env = access.environment()
    assert set(env) == {"KAFKA_CLIENT_CONFIG", "KAFKA_BOOTSTRAP_SERVERS", "KAFKA_CLIENT_CONFIG_CHECK",
                        "KAFKA_CLIENT_CONFIG_SOURCE"}
    back = KafkaAccess.from_environment(env)
    assert back == access
    assert back.of("check").principal == "User:check"
    assert back.of("generate").principal == "User:admin"  # no principal of its own: the admin's
    assert KafkaAccess.from_environment({"KAFKA_BOOTSTRAP_SERVERS": "h:1"}) == KafkaAccess.plain("h:1")
    assert KafkaAccess.from_environment({}) is None


def test_a_child_gets_one_principal_only() -> None:
    parent = {"PATH": "/bin", **KafkaAccess(KafkaConnection(SECURED), {"check": role("check")}).environment()}
    child = role("source").child_environment(parent)
    assert child["PATH"] == "/bin"
    assert json.loads(child["KAFKA_CLIENT_CONFIG"])["sasl.username"] == "source"
    assert "KAFKA_CLIENT_CONFIG_CHECK" not in child
    assert 'p"w' not in json.dumps(child) and "check-secret" not in json.dumps(child)


def test_grants_follow_the_topics_each_role_uses() -> None:
    t = Topics("r1", pipeline_spec.load("genai_image"))
    topic, group, tx = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
    read, write = AclOperation.READ, AclOperation.WRITE
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    assert acls.grants(t, "source") == [(topic, "r1.intake", write, literal),
                                        (topic, "r1.style", write, literal)]
    assert acls.grants(t, "check") == [(topic, "r1.style", read, literal),
                                       (group, "r1.check", read, literal),
                                       (group, "r1.check", AclOperation.ALTER_CONFIGS, literal),
                                       (group, "r1.check.canary-", read, prefixed),
                                       (tx, "r1.check.", write, prefixed),
                                       (topic, "r1.generate", write, literal),
                                       (topic, "r1.notify", write, literal),
                                       (topic, "r1.dlq", write, literal)]
    assert acls.grants(t, "intake")[:2] == [(topic, "r1.intake", read, literal),
                                            (group, "r1.intake", read, literal)]


def test_only_principals_other_than_the_admin_are_granted_anything() -> None:
    t = Topics("r1", pipeline_spec.load("genai_image"))
    assert acls.bindings(t, KafkaAccess.plain("h:1")) == []
    admin_as_role = KafkaAccess(KafkaConnection(SECURED), {"check": KafkaConnection(SECURED)})
    assert acls.bindings(t, admin_as_role) == []
    bindings = acls.bindings(t, KafkaAccess(KafkaConnection(SECURED), {"generate": role("generate")}))
    # generate: read its topic and group (and set its group's configs), write notify and the DLQ,
    # commit under its canaries' groups and use its members' transactional ids (both by prefix:
    # the canaries and the members are not known yet)
    assert sorted((b.restype.name, b.name, b.resource_pattern_type.name, b.operation.name)
                  for b in bindings) == [
        ("GROUP", "r1.generate", "LITERAL", "ALTER_CONFIGS"), ("GROUP", "r1.generate", "LITERAL", "READ"),
        ("GROUP", "r1.generate.canary-", "PREFIXED", "READ"),
        ("TOPIC", "r1.dlq", "LITERAL", "WRITE"), ("TOPIC", "r1.generate", "LITERAL", "READ"),
        ("TOPIC", "r1.notify", "LITERAL", "WRITE"), ("TRANSACTIONAL_ID", "r1.generate.", "PREFIXED", "WRITE")]
    assert {b.principal for b in bindings} == {"User:generate"}
