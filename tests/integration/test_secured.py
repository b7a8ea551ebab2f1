"""The platform on a secured cluster: SASL_SSL with SCRAM-SHA-512 and ACLs on three brokers, and
PostgreSQL with password authentication (the `secure` stack, ports +22000, which the module
starts beside the open one and stops after it). Each role runs as its own principal, held by ACLs
to its own topics and group; nothing without credentials gets in; and no password reaches a log
or a results file.

The tests share one pipeline run and build on each other; the leak check comes last and greps
what the others wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from consumers.config import pipeline_spec
from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.config.events import Topics, canary_group
from consumers.config.kafka_connection import KafkaConnection
from consumers.runs.pipeline_run import running_pipeline
from infra import ai_gateway, spark_connect
from infra import stack as local_stack
from infra.layout import SASL_SSL, Layout
from infra.spark_cluster import LOCAL
from tests.integration.pipeline_fixtures import TIME_SCALE, AIService, ai_service, query, scalar
from tests.integration.test_dags import decision_of, tuning_conf
from tests.stack import REPO, Stack

BURST = 120
# What the secured tests printed or wrote outside the stack's own logs (grepped last).
OUTPUTS: list[str] = []

REFERENCE = pipeline_spec.load("genai_image")
ROLES = pipeline_spec.roles()


@pytest.fixture(scope="module")
def secure() -> Iterator[Stack]:
    """The secured stack for this module: started here and stopped after it (its idle brokers
    would share the cores with the rest of the suite), unless it was running already."""
    layout = Layout("secure")
    with local_stack.started(layout, 3, SASL_SSL, LOCAL, ai_gateway.NONE):
        env = layout.saved_env()
        if env.get("SECURITY") != SASL_SSL:
            pytest.fail(f"the running secure stack is not secured ({env.get('SECURITY')}): "
                        "`STACK=secure python -m infra.stack down` first")
        yield Stack(layout, env)


@pytest.fixture(scope="module")
def ai() -> Iterator[AIService]:
    with ai_service() as service:
        yield service


@pytest.fixture(scope="module")
def secured_run(secure: Stack, ai: AIService) -> Topics:
    """One burst through the reference pipeline in flow mode, every role as its own principal."""
    access = secure.kafka
    # Guard: a run as the admin everywhere would pass without testing any ACL.
    assert {role: access.of(role).principal for role in ROLES} == {r: f"User:{r}" for r in ROLES}
    assert set(ROLES) >= {"source", *REFERENCE.stages}
    assert access.default.principal == "User:admin" and secure.brokers == 3
    config = PipelineConfig(partitions=6, time_scale=TIME_SCALE, replication_factor=3,
                            stages={"intake": StageConfig("flow", members=1, window=16),
                                    "check": StageConfig("flow", members=1, window=16),
                                    "generate": StageConfig("flow", members=2, window=8)})
    ai.reset()
    with running_pipeline(config, access, secure.database_url, ai.endpoints) as pipeline:
        pipeline.send(BURST, reject_share=0.1)
        counts = pipeline.wait_terminal(BURST, timeout_s=180)
    assert counts.get("completed", 0) + counts.get("rejected", 0) == BURST, counts
    return pipeline.topics


def test_the_reference_pipeline_runs_end_to_end_under_least_privilege(secure: Stack, ai: AIService,
                                                                      secured_run: Topics) -> None:
    run_id = secured_run.prefix
    results = dict(query(secure.database_url, "SELECT stage, count(*) FROM stage_results WHERE run_id = %s "
                         "GROUP BY stage", run_id))
    assert results["intake"] == results["check"] == BURST
    assert results["generate"] == scalar(secure.database_url, "SELECT count(*) FROM requests WHERE "
                                         "run_id = %s AND status = 'completed'", run_id) > 0
    assert scalar(secure.database_url, "SELECT count(*) FROM dead_letters WHERE run_id = %s", run_id) == 0
    stats = ai.stats()
    assert stats["check"]["served"] == BURST and stats["check"]["duplicate_served"] == 0
    assert stats["generate"]["served"] == results["generate"] and stats["generate"]["duplicate_served"] == 0
    # Each role holds exactly the grants it was given for this run, as the broker reports them.
    admin = secure.connection.admin()
    for role in ("source", *REFERENCE.stages):
        found = admin.describe_acls(AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{role}", None, AclOperation.ANY,
            AclPermissionType.ANY), request_timeout=30).result()
        mine = sorted((b.restype.name, b.name, b.resource_pattern_type.name, b.operation.name) for b in found
                      if b.name.startswith(f"{run_id}."))
        written = {"source": [], "intake": ["notify"], "check": ["generate", "notify"],
                   "generate": ["notify"]}[role]
        expected = [("TOPIC", f"{run_id}.{t}", "LITERAL", "WRITE") for t in ("intake", "style")] \
            if role == "source" else [
                ("GROUP", f"{run_id}.{role}", "LITERAL", "READ"),
                ("GROUP", f"{run_id}.{role}", "LITERAL", "ALTER_CONFIGS"),
                # the groups its canaries' members commit under
                ("GROUP", f"{run_id}.{role}.canary-", "PREFIXED", "READ"),
                ("TOPIC", secured_run.source_of(role), "LITERAL", "READ"),
                # its members' transactional ids, for exactly-once outputs
                ("TRANSACTIONAL_ID", f"{run_id}.{role}.", "PREFIXED", "WRITE"),
                *(("TOPIC", f"{run_id}.{t}", "LITERAL", "WRITE") for t in [*written, "dlq"])]
        assert mine == sorted(expected), role


def refused(config: dict) -> set[int]:
    """The error codes a client with `config` sees trying to read the cluster's metadata, which
    it must fail to do."""
    seen: list[KafkaError] = []
    client = AdminClient({**config, "error_cb": seen.append, "log_level": 0})
    with pytest.raises(KafkaException):
        client.list_topics(timeout=8)
    client.poll(1)  # errors reach error_cb from poll
    return {e.code() for e in seen}


def test_a_principal_without_the_acl_is_refused(secure: Stack, secured_run: Topics) -> None:
    check = secure.kafka.of("check")
    # Another stage's topic: check may read only the style topic.
    codes = consume_errors(check, secured_run.group_of("check"), secured_run.name("intake"))
    assert KafkaError.TOPIC_AUTHORIZATION_FAILED in codes
    # Its own topic under another stage's group.
    codes = consume_errors(check, secured_run.group_of("generate"), secured_run.name("style"))
    assert KafkaError.GROUP_AUTHORIZATION_FAILED in codes
    # The load source may not write a stage's output.
    failures: list[KafkaError] = []
    producer = Producer(secure.kafka.of("source").client(**{"message.timeout.ms": 10000}))
    producer.produce(secured_run.name("generate"), b"{}", on_delivery=lambda err, _m: failures.append(err))
    producer.flush(15)
    assert [e.code() for e in failures if e] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_a_stage_commits_under_its_own_canaries_groups_only(secure: Stack, secured_run: Topics) -> None:
    # A canary's members assign() the partitions lent to them and commit under a group of
    # their own (consumers/canary/loans.py), as their stage's principal.
    check, topic = secure.kafka.of("check"), secured_run.source_of("check")
    assert committed_once(check, canary_group(secured_run.group_of("check"), 7), topic) == 1
    codes = consume_errors(check, canary_group(secured_run.group_of("generate"), 7), topic)
    assert KafkaError.GROUP_AUTHORIZATION_FAILED in codes


def committed_once(connection: KafkaConnection, group: str, topic: str) -> int:
    """Commit offset 1 of `topic`'s partition 0 as `group`, as a canary member does; what the
    group has committed there afterwards."""
    consumer = Consumer(connection.client(**{"group.id": group, "enable.auto.commit": False}))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        return consumer.committed([TopicPartition(topic, 0)], timeout=20)[0].offset
    finally:
        consumer.close()


def consume_errors(connection: KafkaConnection, group: str, topic: str, timeout_s: float = 20.0) -> set[int]:
    """The error codes `connection` meets consuming `topic` as `group`, until the first one."""
    consumer = Consumer(connection.client(**{"group.id": group, "enable.auto.commit": False,
                                             "auto.offset.reset": "earliest"}))
    try:
        consumer.subscribe([topic])
        deadline, messages = time.monotonic() + timeout_s, []
        while time.monotonic() < deadline and not any(m.error() for m in messages):
            messages += consumer.consume(10, timeout=1.0)
    finally:
        consumer.close()
    return {m.error().code() for m in messages if m.error()}


def test_clients_without_valid_credentials_are_refused(secure: Stack) -> None:
    admin = secure.connection
    assert admin.admin().list_topics(timeout=20).brokers  # guard: the admin itself gets in
    # A PLAINTEXT client's requests on the TLS listener go unanswered: it never reaches a broker.
    assert KafkaError._ALL_BROKERS_DOWN in refused({"bootstrap.servers": admin.bootstrap})
    assert KafkaError._AUTHENTICATION in refused(admin.client(**{"sasl.password": "not-the-password"}))


def test_postgresql_refuses_a_connection_without_the_password(secure: Stack) -> None:
    url = urlsplit(secure.database_url)
    assert url.password  # guard: the stack's URL carries one
    assert query(secure.database_url, "SELECT 1") == [(1,)]
    host = url.netloc.rsplit("@", 1)[1]
    for netloc in (f"{url.username}@{host}", f"{url.username}:not-the-password@{host}"):
        with pytest.raises(psycopg2.OperationalError, match="password"):
            psycopg2.connect(urlunsplit(url._replace(netloc=netloc)), connect_timeout=10).close()


def test_partition_load_reads_the_secured_topic_through_spark_submit(secure: Stack, secured_run: Topics,
                                                                     tmp_path: Path) -> None:
    output = tmp_path / "load.json"
    env = {k: v for k, v in secure.subprocess_env().items() if k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = sys.executable
    # The connection (credentials included) reaches the job in its environment, as the DAG passes it.
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
           "--jars", secure.env["SPARK_JARS"], str(REPO / "spark" / "partition_load.py"),
           "--topics", secured_run.name("style"), "--run-id", f"{secured_run.prefix}-load",
           "--output-json", str(output)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    OUTPUTS.append(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    document = json.loads(output.read_text())
    assert sum(p["records"] for p in document["partitions"]) == BURST
    assert len(document["partitions"]) == 6
    assert scalar(secure.database_url, "SELECT sum(records) FROM analysis_partition_load WHERE run_id = %s",
                  f"{secured_run.prefix}-load") == BURST


def test_pipeline_tuning_succeeds_on_the_secured_stack(secure: Stack) -> None:
    """The whole DAG as its principals: provisioning with grants, two trials, the analysis and a
    decision. Which way the gate decides is the open stack's test (test_dags.py): on a busy
    machine two trials' interval is too wide to promote anything."""
    run = secure.run_dag("pipeline_tuning", conf=tuning_conf("flow"))
    OUTPUTS.append(run.output)
    assert run.state == "success", run.output[-6000:]
    _, _, name, _, reasons, figures = decision_of(secure, run)
    assert name == "flow" and {r["name"] for r in reasons} >= {"utilization"}, reasons
    assert [t["produced"] - t["completed"] for t in figures["trials"]] == [0, 0]
    # The DAG's provisioning granted each stage's principal its trial topics: the fleets it
    # deployed ran as those principals (the admin needs no grant).
    trial, admin = figures["trials"][0]["run_id"], secure.connection.admin()
    acls = admin.describe_acls(AclBindingFilter(
        ResourceType.GROUP, None, ResourcePatternType.ANY, None, None, AclOperation.READ,
        AclPermissionType.ALLOW), request_timeout=30).result()
    # each stage's group, and by prefix its canaries' groups
    assert {(b.name, b.principal) for b in acls if b.name.startswith(f"{trial}.")} == {
        (f"{trial}.{stage}{canaries}", f"User:{stage}") for stage in REFERENCE.stages
        for canaries in ("", ".canary-")}


def secrets_of(env: dict[str, str]) -> set[str]:
    """Every password the stack generated: the Kafka principals', PostgreSQL's and the Spark
    Connect server's token."""
    found = {json.loads(v)["sasl.password"] for k, v in env.items()
             if k.startswith("KAFKA_CLIENT_CONFIG") and "sasl.password" in json.loads(v)}
    found.add(urlsplit(env["DATABASE_URL"]).password)
    found.add(spark_connect.token_of(env["SPARK_CONNECT_URL"]))
    return found


def is_log(path: Path) -> bool:
    """A log file of the stack, not a data file named .log (Kafka's segments, PostgreSQL's WAL)."""
    if path.parts[0] == "postgres":
        return path == Path("postgres/server.log")
    return "data" not in path.parts


def test_no_password_in_any_log_or_result(secure: Stack) -> None:
    secrets = secrets_of(secure.env)
    assert len(secrets) == len(ROLES) + 3  # admin, each role, PostgreSQL, the Connect server
    root = secure.layout.root
    logs = [p for p in root.rglob("*.log") if is_log(p.relative_to(root))]
    results = [p for p in (REPO / "results").rglob("*") if p.is_file()
               and p.stat().st_mtime >= secure.layout.env_file.stat().st_mtime]
    # Guards: the files the secured run wrote are all here, so the check cannot pass on nothing.
    names = {str(p.relative_to(root)) for p in logs}
    assert any(n.startswith("supervisor/logs/fleet-") for n in names), sorted(names)[:20]
    assert {"kafka-1/logs/server.log", "postgres/server.log", "ai-service.log",
            "supervisor/supervisord.log", "spark/logs/connect.log"} <= names
    assert any(p.name == "gate.txt" for p in results) and len(OUTPUTS) == 2
    # `airflow dags test` logs its tasks to its output: the Spark jobs and the deployments.
    assert all(task in OUTPUTS[1] for task in ("partition_load", "pipeline_analysis", "trials", "gate"))
    leaks = [str(p) for p in [*logs, *results]
             if any(s.encode() in p.read_bytes() for s in secrets)]
    leaks += [f"output {i}" for i, text in enumerate(OUTPUTS) if any(s in text for s in secrets)]
    assert leaks == []
