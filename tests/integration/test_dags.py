"""DAG tests: every DAG loads with the metadata users rely on, the forms reject bad input, the
smoke DAG and the tuning DAG run against the real stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.pipeline_fixtures import query
from tests.stack import REPO, DagTestRun, Stack

DAG_FILES = sorted(p for p in (REPO / "dags").glob("*.py") if not p.name.startswith("_"))


@pytest.fixture(scope="module")
def dag_bag(stack: Stack):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_no_import_errors(dag_bag) -> None:
    assert dag_bag.import_errors == {}


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_each_file_defines_a_dag(dag_bag, path: Path) -> None:
    assert any(Path(dag.fileloc) == path for dag in dag_bag.dags.values()), f"no DAG from {path.name}"


def test_every_dag_has_owner_tags_retries_docs_and_described_typed_params(dag_bag) -> None:
    problems = []
    for dag_id, dag in dag_bag.dags.items():
        if not dag.tags or not dag.doc_md:
            problems.append(f"{dag_id}: tags and doc_md are required")
        for task in dag.tasks:
            if task.owner in (None, "", "airflow") or task.retries is None:
                problems.append(f"{dag_id}.{task.task_id}: owner and retries are required")
        for name in dag.params:
            param = dag.params.get_param(name)
            if "type" not in param.schema or not param.description:
                problems.append(f"{dag_id}: param {name} needs a type and a description")
    assert problems == []


@pytest.mark.parametrize(("dag_id", "param", "bad", "message"), [
    ("kafka_provision_topics", "target_rps", -5, "less than or equal to the minimum"),
    ("kafka_provision_topics", "profile", "fastest", "is not one of"),
    ("pipeline_tuning", "candidate", "greedy", "is not one of"),
    ("pipeline_tuning", "time_scale", 0, "less than or equal to the minimum"),
    ("pipeline_tuning", "burst", "many", "is not of type 'integer'"),
    ("pipeline_deploy", "action", "restart", "is not one of"),
])
def test_forms_reject_bad_input_with_a_clear_message(dag_bag, dag_id: str, param: str, bad: object,
                                                     message: str) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=message):
        dag_bag.dags[dag_id].params.get_param(param).resolve(value=bad)


def test_smoke_dag_succeeds(stack: Stack) -> None:
    run = stack.run_dag("kafka_smoke")
    assert run.state == "success", run.output[-4000:]


def tuning_conf(candidate: str, **extra: object) -> str:
    return json.dumps({"candidate": candidate, "partitions": 16, "concurrency": 16, "burst": 320,
                       "time_scale": 0.05, "min_throughput_rps": 1.0, **extra})


def decision_of(stack: Stack, run: DagTestRun) -> tuple:
    """The gate decision of one DAG run (its pipeline run id starts with the logical date)."""
    rows = query(stack.database_url, "SELECT d.candidate, c.name, d.passed, d.reasons, d.figures "
                 "FROM gate_decisions d JOIN configurations c ON c.version = d.candidate "
                 "WHERE d.run_id LIKE %s", f"tuning-{run.ts_nodash.lower()}-%")
    assert len(rows) == 1, rows
    return rows[0]


def test_tuning_promotes_a_good_candidate_and_rejects_a_poor_one(stack: Stack) -> None:
    # Whatever an earlier run left active was measured under other conditions: compare the
    # poor candidate with the good one measured here, not the good one with history.
    good = stack.run_dag("pipeline_tuning", conf=tuning_conf("flow", tolerance=0.9))
    assert good.state == "success", good.output[-6000:]
    version, name, passed, reasons, figures = decision_of(stack, good)
    assert (name, passed) == ("flow", True), reasons
    promoted = query(stack.database_url, "SELECT action, figures FROM promotions WHERE version = %s "
                     "ORDER BY id DESC LIMIT 1", version)
    assert promoted and promoted[0][0] == "promote"
    assert promoted[0][1]["throughput_rps"] == figures["throughput_rps"] > 0
    assert query(stack.database_url, "SELECT version FROM configurations WHERE active") == [(version,)]

    poor = stack.run_dag("pipeline_tuning", conf=tuning_conf("baseline"))
    assert poor.state == "success", poor.output[-6000:]
    rejected, name, passed, reasons, _ = decision_of(stack, poor)
    assert (name, passed) == ("baseline", False)
    failed = {r["name"] for r in reasons if not r["passed"]}
    assert failed, reasons
    assert all(r["measured"] is not None and r["required"] for r in reasons if not r["passed"])
    assert query(stack.database_url, "SELECT version FROM configurations WHERE active") == [(version,)]
    assert rejected != version
