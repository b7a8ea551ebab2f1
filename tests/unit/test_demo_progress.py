"""`make demo` shows each task of its run as it starts and ends, from the run's task instances."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from infra import demo

T0 = datetime(2026, 12, 2, 9, 0, 0, tzinfo=UTC)


def at(seconds: int) -> datetime:
    return T0.replace(second=seconds)


class Polls:
    """A connection whose task rows are one list per poll, and a process that ends at the last."""

    def __init__(self, polls: list[list[tuple[Any, ...]]]) -> None:
        self.polls = polls
        self.read = 0

    def cursor(self) -> Polls:
        return self

    def __enter__(self) -> Polls:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, sql: str, params: tuple[Any, ...]) -> None:
        assert params == ("pipeline_tuning", T0.isoformat())

    def fetchall(self) -> list[tuple[Any, ...]]:
        self.read += 1
        return self.polls[self.read - 1]

    def poll(self) -> int | None:
        return 0 if self.read == len(self.polls) - 1 else None


def test_each_task_is_shown_once_when_it_starts_and_once_when_it_ends(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)
    polls = Polls([
        [("check_pipeline", "running", at(1), None), ("trials", None, None, None)],
        [("check_pipeline", "success", at(1), at(3)), ("trials", "running", at(4), None)],
        [("check_pipeline", "success", at(1), at(3)), ("trials", "running", at(4), None)],
        # the last read, after the process ended: a task skipped never started
        [("check_pipeline", "success", at(1), at(3)), ("trials", "success", at(4), at(50)),
         ("alarm", "skipped", None, None)],
    ])
    demo.follow_tasks(polls, "pipeline_tuning", T0, polls)  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == ["  09:00:01 check_pipeline started", "  09:00:03 check_pipeline success in 2s",
                         "  09:00:04 trials started", "  09:00:50 trials success in 46s"]
    assert lines[4].endswith(" alarm skipped") and len(lines) == 5
