"""Which stack a benchmark scenario runs on: `durable`'s own three-broker stack is up for that
scenario only, and one that was already running is left running (infra.stack.started)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import run as bench_run
from bench import stacks as bench_stacks
from consumers.config import presets
from infra import stack as local_stack
from infra.layout import Layout


class RecordedStacks:
    """Stands in for infra.stack's start, stop and state: records what the benchmark starts and
    stops."""

    def __init__(self, running: bool) -> None:
        self.was_running = running
        self.calls: list[tuple[Any, ...]] = []

    def load_state(self, layout: Layout) -> dict[str, Any]:
        return {"name": layout.name}

    def running(self, state: dict[str, Any]) -> bool:
        return self.was_running

    def up(self, layout: Layout, brokers: int, security: str, spark: str, gateway: str) -> None:
        self.calls.append(("up", layout.name, brokers, security, spark, gateway))

    def down(self, layout: Layout) -> None:
        self.calls.append(("down", layout.name))


DURABLE = bench_run.SCENARIOS["durable"]


def stack(brokers: int) -> bench_stacks.Stack:
    return bench_stacks.Stack(kafka=None, database_url=f"db-{brokers}", ai_url=f"ai-{brokers}",  # type: ignore[arg-type]
                           brokers=brokers)


@pytest.fixture
def durable_three() -> bench_stacks.Stack:
    return stack(3)


@pytest.fixture
def stacks(monkeypatch: pytest.MonkeyPatch, durable_three: bench_stacks.Stack, request: pytest.FixtureRequest
           ) -> RecordedStacks:
    recorded = RecordedStacks(running=getattr(request, "param", False))
    for name in ("load_state", "running", "up", "down"):
        monkeypatch.setattr(local_stack, name, getattr(recorded, name))
    monkeypatch.setattr(bench_stacks.Stack, "from_environment", classmethod(lambda cls, env: durable_three))
    return recorded


@pytest.mark.parametrize("name, brokers", [("flow", 1), ("durable", 3), ("flow", 3)])
def test_the_main_stack_runs_what_needs_no_other(stacks: RecordedStacks, name: str, brokers: int) -> None:
    main = stack(brokers)
    with bench_stacks.scenario_stack(bench_run.SCENARIOS[name].brokers, main, "durable") as where:
        assert where is main
    assert stacks.calls == []


def test_durable_on_one_broker_starts_its_stack_and_stops_it_after(
        stacks: RecordedStacks, durable_three: bench_stacks.Stack) -> None:
    with bench_stacks.scenario_stack(DURABLE.brokers, stack(1), "durable") as where:
        assert where is durable_three
        assert stacks.calls == [("up", "durable", 3, "plaintext", "local", "none")]
    assert stacks.calls == [("up", "durable", 3, "plaintext", "local", "none"), ("down", "durable")]


def test_a_failing_scenario_still_stops_the_stack(stacks: RecordedStacks) -> None:
    with pytest.raises(RuntimeError, match="burst timed out"), \
            bench_stacks.scenario_stack(DURABLE.brokers, stack(1), "durable"):
        raise RuntimeError("burst timed out")
    assert stacks.calls[-1] == ("down", "durable")


@pytest.mark.parametrize("stacks", [True], indirect=True)
def test_a_stack_already_running_is_left_running(stacks: RecordedStacks) -> None:
    with bench_stacks.scenario_stack(DURABLE.brokers, stack(1), "durable"):
        pass
    assert stacks.calls == [("up", "durable", 3, "plaintext", "local", "none")]


def test_each_preset_is_a_scenario_and_durable_is_flow_on_three_brokers() -> None:
    assert list(bench_run.SCENARIOS) == [*presets.NAMES, "durable"]
    assert (DURABLE.preset, DURABLE.brokers) == ("flow", 3)
    assert {s.name for s in bench_run.SCENARIOS.values() if s.brokers > 1} == {"durable"}


def test_only_flow_adaptive_meets_a_moving_limit() -> None:
    p = presets.PresetParams(concurrency=64, burst=1280, time_scale=1.0)
    # the burst needs 1280 / (64 / 3 s) = 60 s at full capacity: the limit halves at 24 s, back at 48 s
    assert bench_run.SCENARIOS["flow-adaptive"].schedule(p) == [[24.0, 32], [48.0, 64]]
    assert [s.name for s in bench_run.SCENARIOS.values() if s.schedule(p)] == ["flow-adaptive"]
