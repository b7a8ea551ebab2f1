"""Shared fixtures: the stack under test (`make test` starts STACK=test with three brokers)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from infra.layout import Layout
from tests.stack import REPO, Stack


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI timeout, `make test` stopped) interrupts the run as Ctrl-C does, in the
    controller and in each worker: the session's fixtures are torn down before it exits, so what
    they started (a test's supervisord, a module's stack) is stopped, not left running."""
    signal.signal(signal.SIGTERM, _interrupted)


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


# `make test` runs the suite on three workers (pytest-xdist, `--dist loadscope`, TEST_WORKERS=1
# for one process), with the units of work below: every module is one unit, kept whole on one
# worker in its own order, except that the modules driving the stack's Airflow form one unit.
# They share its metadata database and the promotion history that their checks read, and an
# Airflow scheduler would also take up the tasks of an `airflow dags test` run of a DAG it finds
# unpaused: the module that runs the measuring DAG tests comes first, then the canary DAG's (its
# live deployment becomes its pipeline's active version, which the UI's checks read), then the two
# that share one standalone Airflow (`standalone_airflow`, tests/integration/conftest.py), started once.
#
# The Airflow unit is the longest: one worker runs it whole while the other two take every other
# unit in the order below. First the DAG tests that hold nothing of the stack's (the smoke DAG, a
# refused spec, a redrive), done long before the standalone Airflow starts; then long modules
# that need neither the AI stand-in nor the Spark master, while the Airflow unit's measuring runs
# hold the stand-in (`stand_in_lock`); then the benchmark, which holds the Spark master
# (`spark_master_lock`) on a stand-in of its own, before the modules that start Spark in the
# worker's own process (a later session there keeps the first one's master, local[2], and the
# benchmark checks that its Spark measurement ran on the stack's), the Spark master's last, and
# the supervised fleets, which hold the stand-in once the measuring runs are done.
AIRFLOW_MODULES = tuple(f"tests/integration/{name}.py" for name in
                        ("test_dags", "test_canary_dag", "test_triage", "test_airflow_ui"))
FIRST = tuple(f"tests/integration/{name}.py" for name in (
    "test_dag_smoke_and_refused_spec", "test_redrive", "test_secured", "test_router_peer", "test_pipeline",
    "test_gateway", "test_bad_input", "test_share_group", "test_spark_diagnosis", "test_bench_smoke",
    "test_spark_jobs", "test_spark_io", "test_spark_cluster", "test_supervised_fleet"))
# The unit modules that start Spark share a worker, whose JVM then starts once; they come before
# the other units, which the second worker takes meanwhile.
SPARK_UNITS = tuple(f"tests/unit/{name}.py"
                    for name in ("test_spark_transforms", "test_partition_load_topics"))


def unit_of_work(module: str) -> str:
    """The unit of work a module's tests belong to (`module`: its path from the repository)."""
    if module in AIRFLOW_MODULES:
        return "airflow"
    return "spark units" if module in SPARK_UNITS else module


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


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each worker the distribution mode: xdist resets a worker's own `dist` option to "no",
    and the order below is the workers' collection, which the scheduler hands out."""
    node.workerinput["dist"] = node.config.getvalue("dist")


def distribution(config: pytest.Config) -> str:
    """The run's `--dist` mode, on the controller and on a worker alike."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get("dist", "no") if workerinput is not None else config.getoption("dist", "no")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if distribution(config) != "loadscope":
        return  # one process: the order as collected

    def rank(item: pytest.Item) -> tuple[int, int]:
        module = item.path.relative_to(REPO).as_posix()
        if module in AIRFLOW_MODULES:
            return 0, AIRFLOW_MODULES.index(module)
        if module in FIRST:
            return 1 + FIRST.index(module), 0
        return 1 + len(FIRST) + (module not in SPARK_UNITS), 0

    items.sort(key=rank)  # stable: a module's tests keep their order
