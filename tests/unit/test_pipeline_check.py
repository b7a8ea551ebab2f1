"""A pipeline is refused before anything is provisioned for it: an unknown field, a route to an
undeclared topic, an endpoint whose Airflow connection is not defined and a quota that is not
declared or is refused each fail the DAGs' first task (`CheckPipelineOperator`, on
`pipeline_check.validated`) and the command line, with the path of the field at fault. Specs
are read from a $PIPELINES_DIR holding a broken copy."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow.sdk.exceptions import AirflowFailException

from consumers.config import pipeline_spec
from infra.layout import REPO
from pipeline_ops.operators.check import CheckPipelineOperator

AI_SERVICE = "http://127.0.0.1:8600/?stand_in=true"


def unknown_field(spec: dict[str, Any]) -> None:
    spec["stages"]["check"]["retries"] = 3


def undeclared_topic(spec: dict[str, Any]) -> None:
    spec["stages"]["moderate"]["routes"][0]["to"] = "summaries"


def undefined_connection(spec: dict[str, Any]) -> None:
    spec["endpoints"]["summarize"]["connection"] = "ai_summaries"


def undeclared_quota(spec: dict[str, Any]) -> None:
    spec["endpoints"]["generate"]["quota"] = "lab_account"


# (spec to break, how, the field path the refusal names, what it says)
BROKEN = {
    "unknown field": ("genai_image", unknown_field, "stages.check.retries", "Extra inputs are not permitted"),
    "undeclared topic": ("text_moderation", undeclared_topic, "stages.moderate.routes.0.to",
                         "topic 'summaries' is not declared"),
    "missing connection": ("text_moderation", undefined_connection, "endpoints.summarize.connection",
                           "connection 'ai_summaries' is not defined"),
    "undeclared quota": ("genai_image", undeclared_quota, "endpoints.generate.quota",
                         "quota 'lab_account' is not declared"),
}


@pytest.fixture
def pipelines_dir(spec_copies: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the project's specs and quotas in $PIPELINES_DIR, and the stand-in's connection
    defined."""
    monkeypatch.setenv("AIRFLOW_CONN_AI_SERVICE", AI_SERVICE)
    monkeypatch.setenv("AIRFLOW_CONN_LLM", AI_SERVICE)
    return spec_copies


def break_spec(folder: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> None:
    path = folder / f"{name}.yaml"
    spec = yaml.safe_load(path.read_text())
    edit(spec)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))


def check(pipeline: str) -> dict[str, Any]:
    return CheckPipelineOperator(task_id="check_pipeline", pipeline=pipeline).execute({})


def cli(pipeline: str, folder: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`python -m pipeline_ops.pipeline_check` with only the stand-in's Airflow connections."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PIPELINES_DIR"))}
    env.update({"PYTHONPATH": f"{REPO}:{REPO / 'plugins'}", "AIRFLOW_HOME": str(tmp_path / "airflow"),
                "AIRFLOW_CONN_AI_SERVICE": AI_SERVICE, "AIRFLOW_CONN_LLM": AI_SERVICE,
                "PIPELINES_DIR": str(folder)})
    return subprocess.run([sys.executable, "-m", "pipeline_ops.pipeline_check", pipeline], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", pipeline_spec.available())
def test_a_valid_spec_passes_and_tells_later_tasks_about_itself(pipelines_dir: Path, name: str) -> None:
    spec = pipeline_spec.load(name)
    assert check(name) == {"pipeline": name, "completing_stage": spec.completing_stage,
                           "measure": spec.load.measure}


@pytest.mark.parametrize("case", BROKEN)
def test_the_dag_check_refuses_naming_the_field(pipelines_dir: Path, case: str) -> None:
    name, edit, path, message = BROKEN[case]
    break_spec(pipelines_dir, name, edit)
    with pytest.raises(AirflowFailException) as refused:  # fails the task, without retries
        check(name)
    assert f"{path}: {message}" in str(refused.value)


def test_the_dag_check_refuses_a_spec_whose_quota_is_refused_naming_the_quota_field(
        pipelines_dir: Path) -> None:
    break_spec(pipelines_dir, "genai_image", lambda spec: spec["endpoints"]["generate"].update(
        quota="ai_service"))
    quota = pipelines_dir / "quotas" / "ai_service.yaml"
    quota.write_text(quota.read_text().replace("genai_image: {weight: 1,", "genai_image: {weight: 0,"))
    with pytest.raises(AirflowFailException) as refused:
        check("genai_image")
    assert str(refused.value).startswith(f"quota {quota} refused:")
    assert "pipelines.genai_image.weight: Input should be greater than 0" in str(refused.value)


def test_the_dag_check_refuses_when_no_endpoint_connection_is_defined(
        pipelines_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_AI_SERVICE")
    with pytest.raises(AirflowFailException) as refused:
        check("genai_image")
    assert {"endpoints.check.connection", "endpoints.generate.connection"} <= {
        line.strip().split(":")[0] for line in str(refused.value).splitlines()[1:]}


def test_the_dag_check_refuses_a_version_of_another_pipeline(pipelines_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []

    class Registry:
        def get(self, version: int, pipeline: str | None = None) -> None:
            asked.append((version, pipeline))
            raise ValueError(f"version {version} is a configuration of genai_image, not of {pipeline}")

    monkeypatch.setattr("pipeline_ops.operators.check.ConfigRegistry", lambda *_args: Registry())
    op = CheckPipelineOperator(task_id="check_pipeline", pipeline="text_moderation", version="3")
    with pytest.raises(AirflowFailException, match="not of text_moderation"):
        op.execute({})
    assert asked == [(3, "text_moderation")]
    CheckPipelineOperator(task_id="check_pipeline", pipeline="text_moderation", version="").execute({})


def test_the_command_line_passes_a_valid_spec(pipelines_dir: Path, tmp_path: Path) -> None:
    done = cli("text_moderation", pipelines_dir, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "text_moderation: stages moderate, summarize, classify, join" in done.stdout


@pytest.mark.parametrize(("case", "by_path"), [("missing connection", False), ("undeclared topic", True),
                                             ("undeclared quota", True)])
def test_the_command_line_refuses_naming_the_field(pipelines_dir: Path, tmp_path: Path, case: str,
                                                   by_path: bool) -> None:
    """Every refusal's message is the DAG check's (above); the command line adds its exit status,
    a spec given by name or by path, and the connections of its own environment."""
    name, edit, path, message = BROKEN[case]
    break_spec(pipelines_dir, name, edit)
    done = cli(str(pipelines_dir / f"{name}.yaml") if by_path else name, pipelines_dir, tmp_path)
    assert done.returncode != 0
    assert f"{path}: {message}" in done.stderr, done.stderr[-2000:]
