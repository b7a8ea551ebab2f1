"""Airflow connections to the runtime's Kafka access, and what a deployed fleet is handed: its
own principal's connection in its environment, no other principal's secrets, the pipeline's AI
endpoints and specs (no services)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from consumers.config import pipeline_spec
from consumers.config.candidate import PipelineConfig
from consumers.config.kafka_connection import KafkaAccess, KafkaConnection
from pipeline_ops import connections
from pipeline_ops.fleets import FleetEnvironment
from pipeline_ops.fleets.program import fleet_program

ADMIN = {"bootstrap.servers": "127.0.0.1:39092", "security.protocol": "SASL_SSL",
         "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin", "sasl.password": "admin-pw",
         "ssl.ca.location": "/tls/ca.pem"}


def kafka_conn(settings: dict) -> str:
    return json.dumps({"conn_type": "kafka", "extra": settings})


def test_a_role_without_a_connection_of_its_own_runs_as_the_admin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", kafka_conn({**ADMIN, "group.id": "airflow"}))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT_CHECK",
                       kafka_conn({**ADMIN, "sasl.username": "check", "sasl.password": "check-pw"}))
    access = connections.kafka_access("kafka_default")
    assert dict(access.default.settings) == ADMIN  # the consumer's group.id is not the connection's
    assert access.of("check").principal == "User:check"
    assert access.of("generate").principal == access.of("source").principal == "User:admin"
    assert access.grantees() == {"check": "User:check"}


def test_any_spec_stage_may_have_a_principal_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", kafka_conn(ADMIN))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT_SUMMARIZE",  # a stage of text_moderation
                       kafka_conn({**ADMIN, "sasl.username": "summarize", "sasl.password": "s-pw"}))
    assert connections.kafka_access("kafka_default").grantees() == {"summarize": "User:summarize"}


def test_a_fleet_gets_its_own_principal_only() -> None:
    check = KafkaConnection({**ADMIN, "sasl.username": "check", "sasl.password": "check-pw"})
    env = FleetEnvironment(KafkaAccess(KafkaConnection(ADMIN), {"check": check}),
                           "postgresql://postgres:db-pw@127.0.0.1:5433/pipeline",
                           {"check": "http://ai/v1/check", "generate": "http://ai/v1/generate"})
    check_env, generate_env = env.variables("check"), env.variables("generate")
    assert json.loads(check_env["KAFKA_CLIENT_CONFIG"])["sasl.username"] == "check"
    assert "admin-pw" not in json.dumps(check_env)
    assert json.loads(generate_env["KAFKA_CLIENT_CONFIG"])["sasl.username"] == "admin"
    assert "check-pw" not in json.dumps(generate_env)
    assert check_env["DATABASE_URL"].endswith("@127.0.0.1:5433/pipeline")
    assert json.loads(check_env["AI_ENDPOINTS"]) == {"check": "http://ai/v1/check",
                                                     "generate": "http://ai/v1/generate"}


def test_a_supervised_fleet_reads_the_specs_where_its_deployer_does(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    config = PipelineConfig()
    monkeypatch.delenv("PIPELINES_DIR", raising=False)
    assert "PIPELINES_DIR" not in fleet_program("p", "r1", "check", config, {}).environment
    monkeypatch.setenv("PIPELINES_DIR", str(tmp_path))
    shutil.copy(pipeline_spec.PIPELINES_DIR / "genai_image.yaml", tmp_path)
    assert fleet_program("p", "r1", "check", config, {}).environment["PIPELINES_DIR"] == str(tmp_path)
