"""The smoke DAG, and the main job refusing a broken spec before anything is provisioned: DAG
runs that use none of the stack's shared services (the AI stand-in, the Spark master, the
registry's active versions), so they run beside the measuring runs of test_dags.py, on another
worker, before the modules that start a standalone Airflow (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from consumers.config import pipeline_spec
from tests.integration.pipeline_fixtures import query
from tests.integration.test_dags import tuning_conf
from tests.stack import Stack


def test_smoke_dag_succeeds(stack: Stack) -> None:
    run = stack.run_dag("kafka_smoke")
    assert run.state == "success", run.output[-4000:]


def test_a_broken_spec_is_refused_before_anything_is_provisioned(stack: Stack, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The main job on a broken spec: `check_pipeline` fails with the field at fault and nothing
    is made. Every pipeline DAG starts with that task (test_dag_parsing.py), so one run shows it."""
    for source in pipeline_spec.PIPELINES_DIR.glob("*.yaml"):
        (tmp_path / source.name).write_text(source.read_text())
    spec = yaml.safe_load((tmp_path / "text_moderation.yaml").read_text())
    spec["stages"]["moderate"]["routes"][0]["to"] = "summaries"  # not a declared topic
    (tmp_path / "text_moderation.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.setenv("PIPELINES_DIR", str(tmp_path))  # run_dag's `airflow dags test` reads it
    tuning = stack.run_dag("pipeline_tuning", conf=tuning_conf("flow", pipeline="text_moderation"))

    assert tuning.state == "failed"
    refusal = "stages.moderate.routes.0.to: topic 'summaries' is not declared"
    assert refusal in tuning.output, tuning.output[-4000:]
    topics = stack.connection.admin().list_topics(timeout=30).topics
    assert [t for t in topics if t.startswith(f"tuning-{tuning.ts_nodash.lower()}")] == []
    # none registered by the refused run (other workers' tests register theirs meanwhile)
    assert query(stack.database_url, "SELECT count(*) FROM configurations WHERE note LIKE %s",
                 f"%{tuning.logical_date[:19]}%") == [(0,)]
