"""Shared fixtures: the stack under test (`make test` starts STACK=test with three brokers)."""

from __future__ import annotations

import os

import pytest

from infra.layout import Layout
from tests.stack import Stack


@pytest.fixture(scope="session")
def stack() -> Stack:
    layout = Layout(os.environ.get("STACK", "test"))
    env = layout.saved_env()
    if not env:
        pytest.fail(f"no running {layout.name} stack: start it with `STACK={layout.name} "
                    "python -m infra.stack up --brokers 3` or run `make test`")
    os.environ.update(env)
    return Stack(layout, env)


@pytest.fixture(scope="session")
def cluster(stack: Stack) -> Stack:
    """The stack, required to have three brokers."""
    if stack.brokers < 3:
        pytest.skip(f"needs the three-broker cluster; this stack has {stack.brokers}")
    return stack
