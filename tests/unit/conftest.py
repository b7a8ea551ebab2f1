"""Unit tests run without the stack: Airflow, imported by the operator tests, gets a home of its
own under .local/ instead of ~/airflow when no stack env set one; the Spark units share one
local session (their modules run on one worker: tests/conftest.py); tests that break a spec or a
quota break a copy of the project's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from consumers.config import pipeline_spec
from infra.layout import LOCAL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

os.environ.setdefault("AIRFLOW_HOME", str(LOCAL / "unit" / "airflow"))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local Spark session on two cores (imported here: only the Spark units pay for it)."""
    from spark.session import build

    session = build("unit", "local[2]")
    yield session
    session.stop()


@pytest.fixture
def spec_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the project's specs and quotas, in $PIPELINES_DIR."""
    folder = tmp_path / "pipelines"
    for source in pipeline_spec.PIPELINES_DIR.rglob("*.yaml"):
        target = folder / source.relative_to(pipeline_spec.PIPELINES_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text())
    monkeypatch.setenv("PIPELINES_DIR", str(folder))
    return folder
