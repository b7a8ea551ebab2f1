"""The stack's Spark Connect server and the analysis that runs on it, checked without services: its
command line and URL, the Airflow connection the provider's hook reads back, the jobs' sessions,
and the operator's choice between the server and spark-submit."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from infra import spark_connect
from infra.layout import Layout
from infra.stack_env import Credentials, environment, write_env
from pipeline_ops.connections import spark_connect_url
from pipeline_ops.operators import analysis
from spark import analyses, session

TEST = Layout("test")
TOKEN = "t0ken_-x"


def test_the_url_carries_the_token_to_localhost_and_back() -> None:
    url = spark_connect.url(TEST, TOKEN)
    assert url == f"sc://localhost:{TEST.spark_connect_port}/;token={TOKEN}"
    assert spark_connect.token_of(url) == TOKEN
    assert spark_connect.token_of("sc://localhost:1") is None


def test_the_airflow_connection_gives_the_hook_the_same_url(monkeypatch: pytest.MonkeyPatch) -> None:
    env = environment(TEST, 3, "plaintext", Credentials("pg", {}, None, TOKEN), "cluster")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    assert spark_connect_url("spark_connect_default") == env["SPARK_CONNECT_URL"]
    assert env["SPARK_CONNECT_URL"] == spark_connect.url(TEST, TOKEN)
    assert spark_connect_url("spark_connect_missing") is None
    assert "SPARK_REMOTE" not in env  # PySpark would make every session a client of the server


def test_the_token_is_generated_once_and_kept(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    first = Credentials("pg", {}).completed("plaintext")
    assert first.spark_connect and first.spark_connect not in repr(first)
    assert first.completed("plaintext").spark_connect == first.spark_connect
    monkeypatch.setattr("infra.layout.LOCAL", tmp_path)
    write_env(TEST, environment(TEST, 1, "plaintext", first, "local"))
    assert Credentials.saved(TEST).spark_connect == first.spark_connect


@pytest.mark.parametrize(("master", "releases_cores"),
                         [("local[*]", False), ("spark://127.0.0.1:17077", True)])
def test_the_server_command(master: str, releases_cores: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_JARS", "/jars/kafka.jar,/jars/postgresql.jar")
    line = spark_connect.command(TEST, master)
    assert line[0].endswith("/spark-submit")
    assert line[1:7] == ["--class", spark_connect.SERVER_CLASS, "--name", "spark-connect", "--master", master]
    assert line[7:9] == ["--driver-java-options", f"{session.QUICK_JIT} -Dlog4j2.configurationFile="
                         f"{spark_connect.log_config(TEST)}"]  # at INFO its log would show passwords
    conf = dict(arg.split("=", 1) for arg in line[10::2])
    assert conf["spark.connect.grpc.binding.port"] == str(TEST.spark_connect_port)
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert conf["spark.jars"] == "/jars/kafka.jar,/jars/postgresql.jar"
    assert conf["spark.kafka.consumer.cache.timeout"] == session.KAFKA_POOL_IDLE
    assert (conf.get("spark.dynamicAllocation.enabled") == "true") is releases_cores
    assert not [arg for arg in line if "token" in arg.lower()]  # the token stays in the environment


class FakeSession:
    def __init__(self) -> None:
        self.stopped = False
        self.new: FakeSession | None = None

    def stop(self) -> None:
        self.stopped = True

    def newSession(self) -> FakeSession:
        self.new = FakeSession()
        return self.new


def test_a_job_on_the_server_has_a_session_of_its_own_released_after(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, FakeSession]] = []

    def remote(url: str) -> FakeSession:
        made.append((url, FakeSession()))
        return made[-1][1]

    monkeypatch.setattr(session, "remote", remote)
    monkeypatch.setattr(session, "build", lambda *a, **k: pytest.fail("no JVM for a remote job"))
    with session.job_session("job", remote_url="sc://localhost:1") as spark:
        assert spark is made[0][1] and not spark.stopped
    assert spark.stopped


def test_a_submitted_job_leaves_the_application_running(monkeypatch: pytest.MonkeyPatch) -> None:
    application = FakeSession()
    monkeypatch.setattr(session, "build", lambda app_name, master=None: application)
    with session.job_session("job") as spark:
        assert spark is application
    with session.job_session("job", own_settings=True) as spark:
        assert spark is application.new
    assert not application.stopped


def test_the_analyses_on_the_server_start_no_application(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, list[str]] = {}
    monkeypatch.setattr(analyses, "JOBS", {name: lambda args, name=name: seen.setdefault(name, args)
                                           for name in analyses.JOBS})
    monkeypatch.setattr(analyses, "build", lambda *a, **k: pytest.fail("no JVM for remote jobs"))
    analyses.main(["partition_load", "--topics", "t", "--", "pipeline_analysis", "--run-id", "r"],
                  remote="sc://localhost:1/;token=x")
    assert seen == {"partition_load": ["--topics", "t", "--remote", "sc://localhost:1/;token=x"],
                    "pipeline_analysis": ["--run-id", "r", "--remote", "sc://localhost:1/;token=x"]}


@pytest.fixture
def operator(monkeypatch: pytest.MonkeyPatch) -> analysis.AnalysisSubmitOperator:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:1"}}))
    monkeypatch.setenv("AIRFLOW_CONN_POSTGRES_DEFAULT", "postgres://postgres:pw@127.0.0.1:2/pipeline")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    return analysis.AnalysisSubmitOperator(
        task_id="spark_analysis", application="spark/analyses.py",
        spark_connect_conn_id="spark_connect_default",
        application_args=["partition_load", "--topics", "t"])


def test_with_the_connection_the_jobs_run_in_the_task_on_the_server(
        operator: analysis.AnalysisSubmitOperator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
                       json.dumps(spark_connect.connection(TEST, TOKEN)))
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: pytest.fail("no spark-submit"))
    calls = []

    def main(argv: list[str], *, remote: str) -> None:
        calls.append((argv, remote, os.environ["DATABASE_URL"],
                      json.loads(os.environ["KAFKA_CLIENT_CONFIG"])))

    monkeypatch.setattr(analyses, "main", main)
    operator.execute({})
    assert calls == [(["partition_load", "--topics", "t"], spark_connect.url(TEST, TOKEN),
                      "postgresql://postgres:pw@127.0.0.1:2/pipeline", {"bootstrap.servers": "127.0.0.1:1"})]
    assert "DATABASE_URL" not in os.environ  # the task's environment as it was


def test_without_the_connection_spark_submit_runs_the_application(
        operator: analysis.AnalysisSubmitOperator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", raising=False)
    monkeypatch.setattr(analyses, "main", lambda *a, **k: pytest.fail("no server configured"))
    submitted = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: submitted.append(self.env_vars))
    operator.execute({})
    assert submitted[0]["DATABASE_URL"] == "postgresql://postgres:pw@127.0.0.1:2/pipeline"
