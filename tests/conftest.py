"""Shared fixtures: the stack under test (`make test` starts STACK=test with three brokers)."""

from __future__ import annotations

import os

import pytest

from infra.layout import Layout
from tests.stack import REPO, Stack


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


# `make test` runs the suite on two workers (pytest-xdist, `--dist loadscope`, TEST_WORKERS=1 for
# one process), with the units of work below: every module is one unit, kept whole on one worker
# in its own order, except that the modules driving the stack's Airflow form one unit. They
# share its metadata database, its port (a standalone Airflow of their own each) and the
# promotion history that their checks read, and an Airflow scheduler would also take up the
# tasks of an `airflow dags test` run of a DAG it finds unpaused.
AIRFLOW_MODULES = tuple(f"tests/integration/{name}.py" for name in
                        ("test_triage", "test_redrive", "test_airflow_ui", "test_dags"))
# The longest units go first, so that neither worker is left with a long one at the end. The
# Airflow unit is the longest by far; the benchmark and the other modules holding the stack's AI
# stand-in and Spark master (tests/integration/conftest.py) come while the Airflow unit is still
# on Airflow's start and on triage, which need neither. Third comes a short module: a worker
# takes its next unit as soon as its first test ends, and the Airflow worker keeps that unit
# until the whole Airflow unit is done.
FIRST = ("tests/integration/test_bench_smoke.py", "tests/unit/test_confidence.py",
         "tests/integration/test_spark_cluster.py", "tests/integration/test_supervised_fleet.py",
         "tests/integration/test_secured.py", "tests/integration/test_pipeline.py",
         "tests/integration/test_spark_jobs.py", "tests/integration/test_spark_diagnosis.py",
         "tests/integration/test_bad_input.py", "tests/integration/test_delivery.py")


def unit_of_work(module: str) -> str:
    """The unit of work a module's tests belong to (`module`: its path from the repository)."""
    return "airflow" if module in AIRFLOW_MODULES else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """With `--dist loadscope`, the units of work above (xdist's `xdist_group` marks go unread
    with pytest 9: xdist 3.8 renames the test ids through an attribute pytest no longer has)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid.split("::", 1)[0])

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("dist", "no") != "loadscope":
        return  # one process: the order as collected

    def rank(item: pytest.Item) -> tuple[int, int]:
        module = item.path.relative_to(REPO).as_posix()
        if module in AIRFLOW_MODULES:
            return 0, AIRFLOW_MODULES.index(module)
        return (1 + FIRST.index(module) if module in FIRST else 1 + len(FIRST)), 0

    items.sort(key=rank)  # stable: a module's tests keep their order
