"""A flow member's exactly-once commits, on a thread of their own.

With exactly-once outputs a record's outputs leave only with the transaction that commits its
offset (`consumers.outbox`), so every hop of a pipeline waits for a commit. Committed from the
poll loop every commit interval, an output waited up to that interval at each hop, and the poll
loop dispatched nothing while a transaction committed: a burst through three stages ended
seconds later than at least once. Here transactions follow one another as records complete,
at most one at a time and no closer than `min_gap_s`, so an output waits for about one
transaction, and the poll loop goes on dispatching meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Committer:
    """Calls `commit` whenever `wanted()` was called since its last call (at most every
    `min_gap_s`), and at least every `max_gap_s`; a failure goes to `failed` and ends it."""

    def __init__(self, name: str, commit: Callable[[], None], failed: Callable[[Exception], None],
                 min_gap_s: float, max_gap_s: float) -> None:
        self._commit = commit
        self._failed = failed
        self._min_gap_s = min_gap_s
        self._max_gap_s = max_gap_s
        self._wanted = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-commits", daemon=True)

    def start(self) -> Committer:
        self._thread.start()
        return self

    def wanted(self) -> None:
        """Records completed: their offsets (and outputs) may commit."""
        self._wanted.set()

    def stop(self) -> None:
        """Let the transaction under way end, then stop (the member commits the rest itself)."""
        self._done.set()
        self._wanted.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.is_set():
            self._wanted.wait(self._max_gap_s)
            if self._done.is_set():
                return
            self._wanted.clear()
            started = time.monotonic()
            try:
                self._commit()
            except Exception as exc:  # noqa: BLE001 - handed to the member, which ends
                self._failed(exc)
                return
            self._done.wait(max(0.0, self._min_gap_s - (time.monotonic() - started)))
