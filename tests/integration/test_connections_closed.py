"""The runtime's reads of PostgreSQL close what they open (psycopg2's `with connect()` ends a
transaction, not the connection), and waiting for a run polls over one connection instead of
a new authenticated one every quarter second."""

from __future__ import annotations

import uuid

import psycopg2
import pytest
from psycopg2.extensions import connection

from consumers.config import events, pipeline_spec
from consumers.runs import run_figures
from consumers.runs.pipeline_run import Pipeline
from consumers.runtime import storage
from tests.stack import Stack


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[connection]:
    """Every connection the code under test opens, held here so that only an explicit close
    (not the collector) closes it."""
    connections: list[connection] = []
    connect = psycopg2.connect

    def recording(*args: object, **kwargs: object) -> connection:
        connections.append(connect(*args, **kwargs))
        return connections[-1]

    monkeypatch.setattr(psycopg2, "connect", recording)
    return connections


def pipeline(stack: Stack) -> Pipeline:
    topics = events.Topics("conn", pipeline_spec.load(pipeline_spec.REFERENCE))
    return Pipeline(f"conn-{uuid.uuid4().hex[:8]}", topics, None, None, stack.database_url)  # type: ignore[arg-type]


def test_reading_a_runs_records_closes_every_connection_it_opens(stack: Stack,
                                                                opened: list[connection]) -> None:
    run = pipeline(stack)
    assert run.status_counts() == {} and run.settled() == 0
    assert run_figures.rows(stack.database_url, "SELECT 1") == [(1,)]
    assert storage.free_connections(stack.database_url) > 0
    assert len(opened) == 4 and all(conn.closed for conn in opened)


def test_waiting_for_a_run_polls_over_one_connection_and_closes_it(stack: Stack,
                                                                   opened: list[connection]) -> None:
    run = pipeline(stack)
    assert run.wait_terminal(1, timeout_s=1.0) == {}  # nothing settles: it polls until the timeout
    assert len(opened) == 1 and opened[0].closed
