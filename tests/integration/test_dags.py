"""Every DAG loads; the smoke DAG runs to success against the stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.stack import REPO, Stack

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


def test_smoke_dag_succeeds(stack: Stack) -> None:
    state, output = stack.run_dag("kafka_smoke")
    assert state == "success", output[-4000:]
