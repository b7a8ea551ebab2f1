"""The limit's changes, for whoever watches them: the fleet collects a `ChangeLog` and writes it
to the `ai_limits` table."""

from __future__ import annotations

from collections import deque
from typing import Protocol


class LimitWatcher(Protocol):
    """Told each time the limit's whole number of calls moves."""

    def changed(self, at: float, limit: float, in_flight: int) -> None: ...


class ChangeLog:
    """(at, limit, permits held) of each change until collected (`entries`, taken from the left);
    `at` is a reading of the limiter's clock, steady: the wall clock jumps."""

    def __init__(self, history: int = 100_000) -> None:
        self.entries: deque[tuple[float, float, int]] = deque(maxlen=history)

    def changed(self, at: float, limit: float, in_flight: int) -> None:
        self.entries.append((at, limit, in_flight))
