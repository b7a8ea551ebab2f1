"""What integration tests running side by side (`pytest -n 3`, as `make test TEST_WORKERS=3` runs
them) must not do at the same time, and the one Airflow of the modules that drive its UI and
scheduler.

The test stack's AI stand-in and Spark master are shared state, each behind a lock file of the
stack (it holds across the workers' processes, and across concurrent sessions on one stack):

- `stand_in_lock`: a `pipeline_tuning` or `pipeline_capacity` run reconfigures the stand-in
  (time scale, limits), and fleets under supervisord call it at the latency they expect. The
  benchmark's smoke run reconfigures and resets a stand-in of its own.
- `spark_master_lock`: the Spark cluster test counts the applications that finish on the master,
  and the benchmark checks that its Spark measurement left none there. The DAGs' analyses run
  on the stack's Connect server, an application of the master for good, and add none.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
from collections import Counter
from collections.abc import Iterator

import pytest

from consumers.config.pipeline_spec import DEAD_LETTER
from infra import airflow_ui
from pipeline_ops import dead_letter_watch
from tests.stack import Stack, unique

TRIAGE_PREFIX = unique("triage")  # test_triage's runs: <TRIAGE_PREFIX>-<n>.dlq

_holds: Counter[str] = Counter()  # this process's holds of each lock, one inside the other


@contextlib.contextmanager
def _exclusive(stack: Stack, name: str) -> Iterator[None]:
    """The lock file `name` of the stack, until the block ends. Inside a block of this process's
    own, it is held already (a lock of a file opened again would wait for that block)."""
    if _holds[name]:
        _holds[name] += 1
        try:
            yield
        finally:
            _holds[name] -= 1
        return
    stack.layout.root.mkdir(parents=True, exist_ok=True)
    with open(stack.layout.root / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _holds[name] = 1
        try:
            yield
        finally:
            _holds[name] = 0
            fcntl.flock(handle, fcntl.LOCK_UN)


def stand_in_lock(stack: Stack) -> contextlib.AbstractContextManager[None]:
    """Exclusive use of the stack's AI stand-in until the block ends."""
    return _exclusive(stack, "stand-in")


def spark_master_lock(stack: Stack) -> contextlib.AbstractContextManager[None]:
    """Exclusive use of the stack's Spark master (the applications it runs) until the block ends."""
    return _exclusive(stack, "spark-master")


@pytest.fixture(scope="module")
def stand_in_for_module(stack: Stack) -> Iterator[None]:
    """The stack's AI stand-in for this module alone (its module fixtures too: pytest sets up a
    `usefixtures` mark's fixtures before the others)."""
    with stand_in_lock(stack):
        yield


@pytest.fixture
def spark_master(stack: Stack) -> Iterator[None]:
    """The stack's Spark master for this test alone."""
    with spark_master_lock(stack):
        yield


@pytest.fixture(scope="module")
def spark_master_for_module(stack: Stack) -> Iterator[None]:
    """The stack's Spark master for this module alone (its module fixtures too)."""
    with spark_master_lock(stack):
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
