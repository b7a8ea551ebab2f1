"""An AI call observer that keeps each try's ending, for tests of the client's tries."""

from __future__ import annotations

from consumers.ai.client import Try


class Tries:
    def __init__(self) -> None:
        self.done: list[Try] = []

    def started(self, attempt: int, at: float) -> None:
        pass

    def ended(self, attempt: Try) -> None:
        self.done.append(attempt)
