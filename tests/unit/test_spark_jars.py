"""Which jars the Spark jobs and the DAGs' spark-submit get."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import jars


def test_the_environment_overrides_the_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "a.jar").touch()
    monkeypatch.setattr(jars, "JARS_DIR", tmp_path)
    monkeypatch.setenv("SPARK_JARS", "/x/kafka.jar,/x/pg.jar")
    assert jars.connector_jars() == "/x/kafka.jar,/x/pg.jar"


def test_the_folder_lists_only_jars_in_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("b.jar", "a.jar", "notes.txt"):
        (tmp_path / name).touch()
    monkeypatch.setattr(jars, "JARS_DIR", tmp_path)
    monkeypatch.delenv("SPARK_JARS", raising=False)
    assert jars.connector_jars() == f"{tmp_path / 'a.jar'},{tmp_path / 'b.jar'}"


def test_nothing_resolved_is_empty(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(jars, "JARS_DIR", tmp_path)
    monkeypatch.delenv("SPARK_JARS", raising=False)
    assert jars.connector_jars() == ""
