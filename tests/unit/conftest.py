"""Unit tests run without the stack: Airflow, imported by the operator tests, gets a home of its
own under .local/ instead of ~/airflow when no stack env set one; the Spark units share one
local session (their modules run on one worker: tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

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
