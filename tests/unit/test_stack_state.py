"""The stack's state file read into StackState and written back in the form other tools read
(node ids as JSON keys, the cluster's shape), without services."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra import stack
from infra.layout import Layout

WRITTEN = {"brokers": 3, "security": "sasl_ssl", "cluster_id": "c1", "kafka": {"1": 101, "2": 102, "3": 103},
           "ai_service": 200, "gateway": None, "spark": {"master": 301, "worker": 302},
           "spark_connect": {"pid": 400, "master": "spark://127.0.0.1:17077"}}


@pytest.fixture
def layout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Layout:
    monkeypatch.setattr(Layout, "root", property(lambda self: tmp_path / self.name))
    return Layout("test")


def test_a_state_file_reads_typed_and_writes_back_as_it_was(layout: Layout) -> None:
    stack.save_state(layout, WRITTEN)
    state = stack.StackState.load(layout)
    assert state == stack.StackState(3, "sasl_ssl", "c1", {1: 101, 2: 102, 3: 103}, 200, None,
                                     {"master": 301, "worker": 302},
                                     stack.ConnectServer(400, "spark://127.0.0.1:17077"))
    state.save(layout)
    assert json.loads(layout.state_file.read_text()) == WRITTEN


def test_a_stack_never_started_has_no_shape_and_nothing_running(layout: Layout) -> None:
    state = stack.StackState.load(layout)
    assert state == stack.StackState()
    assert (state.brokers, state.security, stack.running(state)) == (0, "plaintext", False)
