"""What a canary step lends, how a step's outcome is decided, and the form's thresholds, worked out
by hand."""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

import pytest

from measure.canary import CanaryThresholds
from pipeline_ops.canary import lent_partitions
from pipeline_ops.operators import canary as operators


@pytest.mark.parametrize(("share", "partitions", "lent"), [
    (0.1, 10, [0]),                 # 1.0 partition
    (0.5, 10, [0, 1, 2, 3, 4]),
    (1.0, 10, list(range(10))),
    (0.34, 6, [0, 1, 2]),           # 2.04: a partial one counts
    (0.01, 6, [0]),                 # never none
    (0.5, 1, [0]),
])
def test_a_step_lends_the_first_ceil_share_times_partitions(share: float, partitions: int,
                                                           lent: list[int]) -> None:
    assert lent_partitions(share, partitions) == lent


def test_a_growing_share_keeps_the_partitions_it_had() -> None:
    steps = [lent_partitions(share, 12) for share in (0.1, 0.25, 0.5, 1.0)]
    assert all(set(a) <= set(b) for a, b in itertools.pairwise(steps))


class FakeTi:
    def __init__(self, step_result: dict[str, Any]) -> None:
        self.step_result = step_result

    def xcom_pull(self, task_ids: str) -> Any:
        return {"canary": 7} if task_ids == "open" else self.step_result


class FakeRecords:
    decisions: ClassVar[list[tuple[int, int, str]]] = []

    def decided(self, canary: int, step: int, decision: str) -> None:
        self.decisions.append((canary, step, decision))


@pytest.mark.parametrize(("outcome", "step", "branch"), [
    ("pass", 1, "step_2"),
    ("pass", 4, "promote"),     # the last analysis step the DAG has
    ("done", 2, "promote"),     # the plan had fewer steps
    ("marginal", 1, "review_1"),
    ("fail", 3, "rollback"),
])
def test_a_steps_outcome_decides_the_branch(monkeypatch: pytest.MonkeyPatch, outcome: str, step: int,
                                            branch: str) -> None:
    FakeRecords.decisions = []
    monkeypatch.setattr(operators, "CanaryRecords", FakeRecords)
    decide = operators.CanaryDecideOperator(task_id=f"decide_{step}", step=step, last=4)
    assert decide.choose_branch({"ti": FakeTi({"outcome": outcome})}) == branch
    expected = [] if outcome == "done" else [(7, step, f"{branch}: {outcome}")]
    assert FakeRecords.decisions == expected


def test_the_forms_thresholds_take_their_declared_types() -> None:
    thresholds = operators.thresholds_of({"alpha": "0.05", "min_samples": "20", "max_cost_increase": 0.2})
    assert thresholds == CanaryThresholds(alpha=0.05, min_samples=20, max_cost_increase=0.2)
    assert isinstance(thresholds.min_samples, int)
