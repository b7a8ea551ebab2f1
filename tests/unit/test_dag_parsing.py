"""Parsing the DAG folder stays light: a fresh interpreter that loads every DAG has imported
neither PySpark nor matplotlib (they load where a job runs or a plot is drawn), and no DAG fails
to import within Airflow's default import timeout. Every DAG that runs a pipeline offers the specs
found as a dropdown and checks the chosen one in its first task. The nightly tuning's schedule
comes from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from consumers.config import pipeline_spec

REPO = Path(__file__).resolve().parents[2]
PIPELINE_DAGS = ("kafka_provision_topics", "pipeline_capacity", "pipeline_deploy", "pipeline_load_test",
                 "pipeline_redrive", "pipeline_skew_analysis", "pipeline_tuning")

PARSE = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
started = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({"dags": sorted(bag.dag_ids), "errors": {k: str(v) for k, v in bag.import_errors.items()},
                  "seconds": time.perf_counter() - started,
                  "heavy": sorted(m for m in ("pyspark", "matplotlib") if m in sys.modules),
                  "pipeline": {i: d.params.get_param("pipeline").schema | {"default": d.params["pipeline"]}
                               for i, d in bag.dags.items() if "pipeline" in d.params},
                  "roots": {i: sorted(t.task_id for t in d.roots) for i, d in bag.dags.items()}}))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The DAG folder parsed in a fresh interpreter, as the DAG processor does."""
    home = tmp_path_factory.mktemp("airflow")
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("AIRFLOW", "PYSPARK", "SPARK", "PIPELINES_DIR"))}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
                "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}"})
    proc = subprocess.run([sys.executable, "-c", PARSE, str(REPO / "dags")], env=env, cwd=home,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_parsing_the_dags_imports_no_pyspark_and_no_matplotlib(parsed: dict) -> None:
    result = parsed
    assert result["errors"] == {}
    # Guard: every DAG file was parsed, so nothing was skipped that could have imported them.
    assert len(result["dags"]) == len(list((REPO / "dags").glob("*.py"))), result["dags"]
    assert result["heavy"] == []


@pytest.mark.parametrize("dag_id", PIPELINE_DAGS)
def test_a_dag_running_a_pipeline_offers_the_specs_and_checks_the_chosen_one_first(parsed: dict,
                                                                                   dag_id: str) -> None:
    param = parsed["pipeline"][dag_id]
    assert param["enum"] == pipeline_spec.available() and "text_moderation" in param["enum"]
    assert param["default"] == pipeline_spec.REFERENCE
    assert parsed["roots"][dag_id] == ["check_pipeline"]


@pytest.mark.parametrize(("value", "expected"), [
    (None, "0 2 * * *"),          # unset: nightly at 02:00
    ("", "0 2 * * *"),            # empty, as an env file may leave it
    ("30 5 * * 1-5", "30 5 * * 1-5"),
    (" None ", None),             # triggered runs only
])
def test_the_tuning_schedule_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                        expected: str | None) -> None:
    from pipeline_ops import dag_support

    if value is None:
        monkeypatch.delenv("PIPELINE_TUNING_SCHEDULE", raising=False)
    else:
        monkeypatch.setenv("PIPELINE_TUNING_SCHEDULE", value)
    assert dag_support.tuning_schedule() == expected
