"""What integration tests running side by side (`pytest -n 3`, as `make test TEST_WORKERS=3` runs
them) must not do at the same time, and the one Airflow of the modules that drive its UI and
scheduler.

The test stack's AI stand-in and Spark master are shared state: a `pipeline_tuning` or
`pipeline_capacity` run reconfigures the stand-in (time scale, limits) and submits its analysis
to the master, the benchmark reconfigures the stand-in, resets its counters and checks that the
master has no application left, the Spark cluster test counts the applications that finished on
the master, and fleets under supervisord call the stand-in at the latency they expect. Each of
these holds `stand_in_lock` while it runs: a lock file of the stack, so it holds across the
workers' processes (and across concurrent sessions on one stack).
"""

from __future__ import annotations

import contextlib
import fcntl
import re
from collections.abc import Iterator

import pytest

from consumers.config.pipeline_spec import DEAD_LETTER
from infra import airflow_ui
from pipeline_ops import dead_letter_watch
from tests.stack import Stack, unique

TRIAGE_PREFIX = unique("triage")  # test_triage's runs: <TRIAGE_PREFIX>-<n>.dlq

_holds = [0]  # this process's holds of the lock, one inside the other (tests run one at a time)


@contextlib.contextmanager
def stand_in_lock(stack: Stack) -> Iterator[None]:
    """Exclusive use of the stack's AI stand-in and Spark master, until the block ends. Inside a
    block of this process's own, it is held already (a lock of a file opened again would wait
    for that block)."""
    if _holds[0]:
        _holds[0] += 1
        try:
            yield
        finally:
            _holds[0] -= 1
        return
    stack.layout.root.mkdir(parents=True, exist_ok=True)
    with open(stack.layout.root / "stand-in.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _holds[0] = 1
        try:
            yield
        finally:
            _holds[0] = 0
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture
def stand_in(stack: Stack) -> Iterator[None]:
    """The stack's AI stand-in and Spark master for this test alone."""
    with stand_in_lock(stack):
        yield


@pytest.fixture(scope="module")
def stand_in_for_module(stack: Stack) -> Iterator[None]:
    """The stack's AI stand-in and Spark master for this module alone (its module fixtures too:
    request it from an autouse module fixture, which pytest sets up before the others)."""
    with stand_in_lock(stack):
        yield


@pytest.fixture(scope="session")
def standalone_airflow(stack: Stack) -> Iterator[str]:
    """One Airflow (UI and API, scheduler, DAG processor, triggerer) on the stack for test_triage
    and test_airflow_ui, which one worker runs one after the other (tests/conftest.py): a start
    takes a minute and more of the two cores. Its dead-letter watcher follows test_triage's
    topics only, so other tests' dead letters wake nothing; the nightly tuning schedule is off,
    as unpausing the DAG would start a run of its own (catchup=False still runs the latest
    missed interval). Yields the UI's base URL."""
    env = {dead_letter_watch.TOPICS_ENV: rf"^{re.escape(TRIAGE_PREFIX)}-.*\.{DEAD_LETTER}$",
           "PIPELINE_TUNING_SCHEDULE": "none"}
    with airflow_ui.running(stack.layout, extra_env=env) as base_url:
        yield base_url
