"""DAG tests: every DAG loads with the metadata users rely on, the forms reject bad input, the
tuning DAG (a good candidate promoted, a poor one rejected, the active version re-measured) and
the capacity DAG run against the real stack. Another pipeline's candidate is tuned from the UI's
form, and rolled back and forth from the gate page (test_airflow_ui.py); the smoke DAG and a
refused spec, which hold nothing of the stack's, run beside these
(test_dag_smoke_and_refused_spec.py).

The runs that use the stack's AI stand-in come first: the order of the suite's workers
(tests/conftest.py) counts on it. Each test's preconditions come from its fixtures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from consumers.config import pipeline_spec
from tests.integration.conftest import stand_in_lock
from tests.integration.pipeline_fixtures import query
from tests.png import drawn
from tests.stack import REPO, DagTestRun, Stack

DAG_FILES = sorted(p for p in (REPO / "dags").glob("*.py") if not p.name.startswith("_"))


@pytest.fixture(scope="module")
def dag_bag(stack: Stack):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_no_import_errors(dag_bag) -> None:
    assert dag_bag.import_errors == {}


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_each_file_defines_a_dag(dag_bag, path: Path) -> None:
    assert any(Path(dag.fileloc) == path for dag in dag_bag.dags.values()), f"no DAG from {path.name}"


def test_every_dag_has_owner_tags_retries_docs_and_described_typed_params(dag_bag) -> None:
    problems = []
    for dag_id, dag in dag_bag.dags.items():
        if not dag.tags or not dag.doc_md:
            problems.append(f"{dag_id}: tags and doc_md are required")
        for task in dag.tasks:
            if task.owner in (None, "", "airflow") or task.retries is None:
                problems.append(f"{dag_id}.{task.task_id}: owner and retries are required")
        for name in dag.params:
            param = dag.params.get_param(name)
            if "type" not in param.schema or not param.description:
                problems.append(f"{dag_id}: param {name} needs a type and a description")
    assert problems == []


@pytest.mark.parametrize(("dag_id", "param", "bad", "message"), [
    ("kafka_provision_topics", "target_rps", -5, "less than or equal to the minimum"),
    ("kafka_provision_topics", "profile", "fastest", "is not one of"),
    ("pipeline_tuning", "candidate", "greedy", "is not one of"),
    ("pipeline_tuning", "pipeline", "genai_video", "is not one of"),
    ("kafka_provision_topics", "pipeline", "", "is not one of"),
    ("pipeline_tuning", "time_scale", 0, "less than or equal to the minimum"),
    ("pipeline_tuning", "burst", "many", "is not of type 'integer'"),
    ("pipeline_tuning", "trials", 1, "less than the minimum of 2"),
    ("pipeline_tuning", "target_utilization", 1.5, "greater than the maximum of 1"),
    ("pipeline_deploy", "action", "restart", "is not one of"),
    ("pipeline_rollback", "reason", "", "should be non-empty"),
    ("pipeline_rollback", "version", -1, "less than the minimum of 0"),
])
def test_forms_reject_bad_input_with_a_clear_message(dag_bag, dag_id: str, param: str, bad: object,
                                                     message: str) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=message):
        dag_bag.dags[dag_id].params.get_param(param).resolve(value=bad)


# Two trials of small bursts at a fast time scale keep each tuning run to a few minutes.
def tuning_conf(candidate: str, **extra: object) -> str:
    return json.dumps({"candidate": candidate, "partitions": 16, "concurrency": 16, "burst": 160,
                       "time_scale": 0.05, "trials": 2, **extra})


# A gate a good candidate passes on the loaded test machine: three trials (the 95% t-interval of
# two, df = 1, t = 12.7, is too wide to clear any target on a machine whose load moves the
# throughput from one trial to the next), a low target, a wide tolerance.
PASSABLE = {"trials": 3, "target_utilization": 0.05, "tolerance": 0.9}
UNREACHABLE_RPS = 1e6  # steady requests/s: a trial serves a few hundred at most


def decision_of(stack: Stack, run: DagTestRun, pipeline: str = pipeline_spec.REFERENCE) -> tuple:
    """The gate decision of one DAG run (its pipeline run id starts with the logical date), of a
    candidate of `pipeline`."""
    rows = query(stack.database_url, "SELECT d.id, d.candidate, c.name, d.passed, d.reasons, d.figures, "
                 "c.pipeline FROM gate_decisions d JOIN configurations c ON c.version = d.candidate "
                 "WHERE d.run_id LIKE %s", f"tuning-{run.ts_nodash.lower()}-%")
    assert len(rows) == 1, rows
    assert rows[0][-1] == pipeline
    return rows[0][:-1]


def active_version(stack: Stack, pipeline: str = pipeline_spec.REFERENCE) -> int | None:
    rows = query(stack.database_url, "SELECT version FROM configurations WHERE active AND pipeline = %s",
                 pipeline)
    return rows[0][0] if rows else None


def checks(reasons: list[dict]) -> dict[str, dict]:
    return {r["name"]: r for r in reasons}


@dataclass(frozen=True)
class Tuning:
    """A tuning DAG run of the reference pipeline, and its active version just before and just
    after the run (read then: a later test may roll it back and forth)."""

    run: DagTestRun
    before: int | None
    after: int | None

    def decision(self, stack: Stack) -> tuple:
        return decision_of(stack, self.run)


def tune(stack: Stack, conf: str) -> Tuning:
    """One tuning run, alone on the stack's AI stand-in and Spark master."""
    with stand_in_lock(stack):
        before = active_version(stack)
        run = stack.run_dag("pipeline_tuning", conf=conf)
        return Tuning(run, before, active_version(stack))


# One run per gate path, each serving the tests of its decision: a good candidate, a poor one
# compared with it, and the good one (then active) re-measured against its own history.
@pytest.fixture(scope="module")
def good(stack: Stack) -> Tuning:
    """flow, with a target and tolerance the loaded test machine meets: whatever an earlier run
    left active was measured under other conditions."""
    return tune(stack, tuning_conf("flow", **PASSABLE))


@pytest.fixture(scope="module")
def good_version(stack: Stack, good: Tuning) -> int:
    """The version the good run measured (what the runs below are compared with)."""
    assert good.run.state == "success", good.run.output[-6000:]
    return good.decision(stack)[1]


@pytest.fixture(scope="module")
def poor(stack: Stack, good_version: int) -> Tuning:
    """baseline, held to the default gate, and to the good candidate measured under the same
    conditions."""
    return tune(stack, tuning_conf("baseline"))


@pytest.fixture(scope="module")
def remeasured(stack: Stack, good_version: int) -> Tuning:
    """The active version re-measured under the good run's conditions. A throughput floor no
    trial can reach makes it fail: the alarm path. A utilization target of 1.0 is not: the
    utilization is the plateau's slope over completions that come in waves, not bounded by 1,
    and a CI run's re-measurement passed that target."""
    return tune(stack, tuning_conf("active", min_throughput_rps=UNREACHABLE_RPS, tolerance=0.9))


@pytest.fixture(scope="class")
def alone_on_the_stand_in(stack: Stack) -> Iterator[None]:
    with stand_in_lock(stack):
        yield


@pytest.mark.usefixtures("alone_on_the_stand_in")
class TestMeasuringRuns:
    """The runs that measure on the stack's AI stand-in and Spark master, kept together: the
    class holds the stand-in from its first test's run on until its last test ends, so that no
    other worker's measurement comes in between (tests/conftest.py orders the workers' units
    around this block)."""

    def test_tuning_measures_trials_and_promotes_a_good_candidate(self, stack: Stack,
                                                                  good: Tuning) -> None:
        assert good.run.state == "success", good.run.output[-6000:]
        _, version, name, passed, reasons, figures = good.decision(stack)
        assert (name, passed) == ("flow", True), reasons
        assert len(figures["trials"]) == 3 and figures["summary"]["trials"] == 3
        assert [t["run_id"].rsplit("-", 1)[-1] for t in figures["trials"]] == ["t1", "t2", "t3"]
        for trial in figures["trials"]:
            assert trial["produced"] == trial["completed"] == 160
            # the binding limit's share used on the plateau, counted on its calls (measure/capacity.py)
            assert trial["binding_limit"] == "generate.concurrency"
            assert 0 < trial["utilization"] <= 1.0
        utilization = checks(reasons)["utilization"]
        interval = utilization["interval"]
        assert utilization["measured"] == interval["low"] <= interval["estimate"]
        assert good.after == version
        promoted = query(stack.database_url, "SELECT action FROM promotions WHERE run_id LIKE %s",
                         f"tuning-{good.run.ts_nodash.lower()}-%")
        assert promoted == ([] if good.before == version else [("promote",)])  # promoting the active: no-op
        run_dir = REPO / "results" / figures["trials"][0]["run_id"].rsplit("-", 1)[0]
        report = (run_dir / "gate.txt").read_text()
        assert "capacity" in report and "utilization" in report and "[" in report
        for plot in ("completions.png", "requests_per_partition.png"):  # 8 inches at 100 dpi
            width, _, series = drawn(run_dir / plot)  # the first trial's line, the partitions' bars
            assert width == 800 and series > 50, (plot, width, series)

    def test_tuning_rejects_a_poor_candidate_against_the_good_one(self, stack: Stack, good_version: int,
                                                                  poor: Tuning) -> None:
        assert poor.before == good_version  # measured while the good candidate was the active one
        assert poor.run.state == "success", poor.run.output[-6000:]
        _, rejected, name, passed, reasons, figures = poor.decision(stack)
        assert (name, passed) == ("baseline", False)
        failed = {r["name"] for r in reasons if not r["passed"]}
        assert {"utilization", "regression"} <= failed, reasons  # far below capacity, and below flow
        assert figures["reference"]["version"] == good_version
        assert all(r["measured"] is not None and r["required"] for r in reasons if not r["passed"])
        assert poor.after == good_version != rejected

    def test_re_measuring_the_active_version_compares_with_its_history_and_raises_an_alarm(
            self, stack: Stack, good_version: int, remeasured: Tuning) -> None:
        assert remeasured.before == good_version  # the good run's version was the one re-measured
        assert remeasured.run.state == "success", remeasured.run.output[-6000:]
        decision_id, candidate, _, passed, reasons, figures = remeasured.decision(stack)
        assert (candidate, passed) == (good_version, False)
        regression = checks(reasons)["regression"]
        assert regression["measured"] is not None and regression["interval"]["n"] == [2, 3], regression
        assert figures["reference"]["version"] == good_version
        alarms = query(stack.database_url, "SELECT version, failed FROM regression_alarms "
                       "WHERE decision_id = %s", decision_id)
        assert len(alarms) == 1 and alarms[0][0] == good_version
        assert "throughput_floor" in {f["name"] for f in alarms[0][1]}
        assert remeasured.after == good_version  # an alarm, not a rollback

    def test_capacity_dag_runs_steps_and_keeps_the_result_beside_the_configuration(
            self, stack: Stack) -> None:
        conf = {"candidate": "flow", "partitions": 8, "concurrency": 8, "flow_members": 2,
                "time_scale": 0.05, "burst": 80, "step_s": 5, "max_steps": 2}
        run = stack.run_dag("pipeline_capacity", conf=json.dumps(conf))
        assert run.state == "success", run.output[-6000:]
        rows = query(stack.database_url, "SELECT s.version, c.name, s.run_id, s.max_sustainable_rps, "
                     "s.ai_capacity_rps, s.objective, s.steps FROM capacity_searches s "
                     "JOIN configurations c USING (version) "
                     "WHERE s.run_id LIKE %s", f"capacity-{run.ts_nodash.lower()}-%")
        assert len(rows) == 1, rows
        _, name, run_id, best, capacity, objective, steps = rows[0]
        assert name == "flow" and capacity > 0
        assert objective["p99_s"] == pytest.approx(10 * 0.05) and objective["step_s"] == 5
        first, second = steps
        assert first["rate"] == pytest.approx(0.9 * capacity)  # the search starts just below capacity
        assert second["rate"] == pytest.approx(first["rate"] * (1.25 if first["sustained"] else 0.8))
        held = [s["rate"] for s in steps if s["sustained"]]
        assert best == (max(held) if held else None)
        width, height, series = drawn(REPO / "results" / run_id / "capacity.png")
        assert (width, height) == (1100, 400) and series > 50  # 11 x 4 inches at 100 dpi, a step's lag drawn
