"""A clock a test moves by hand: the code under test reads `clock()`, the test sets `now`."""

from __future__ import annotations


class HandClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
