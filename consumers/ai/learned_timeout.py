"""How long one try may take, learned from the endpoint's own calls.

A hosted API goes on with a call the client stopped waiting for, and bills it; the retry is
billed again. A timeout taken from the latency a spec declares fires on every call of a tail
longer than declared, so each of them is paid twice. The timeout therefore follows what the
endpoint does: MARGIN times the QUANTILE of its recent successful calls, within a floor (what the
spec's declared latency implies: a shorter timeout saves only the wait on a call that hangs, and
every try it cuts is billed again) and the declared ceiling. Until MIN_SAMPLES calls are in it is
the ceiling: the calls sent before any answer came are a whole window of the fleet's, and a
timeout from the declaration would cut every one of them that the tail holds.

Only served calls teach it, with one correction: a call still out has taken at least as long as it
has run, so the percentile counts each one at its time so far. Without it the first answers of a
burst, the short ones, would set the timeout for the long calls still out. A call that hangs or
times out is not the endpoint's tail: once it ends it teaches nothing, and an outage that times
out every call does not stretch the timeout of the calls after it."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections import deque

QUANTILE = 99  # percentile of the served calls
MARGIN = 4.0  # over the 99th percentile: past the 99.99th of a lognormal tail ten times its median
SAMPLES = 1000  # recent served calls the percentile is taken over
MIN_SAMPLES = 100  # below these a 99th percentile is one call's latency
REFRESH_EVERY = 16  # served calls between two computations of the percentile


class LearnedTimeout:
    """One endpoint's try timeout, shared by every caller of a fleet's client (thread-safe)."""

    def __init__(self, floor_s: float, ceiling_s: float) -> None:
        if not 0 < floor_s <= ceiling_s:
            raise ValueError(f"a timeout's floor is within (0, ceiling]: {floor_s} against {ceiling_s}")
        self.floor_s = floor_s
        self.ceiling_s = ceiling_s
        self._lock = threading.Lock()
        self._served: deque[float] = deque(maxlen=SAMPLES)
        self._out: dict[int, float] = {}  # calls sent and not ended: when each was sent
        self._tickets = itertools.count()
        self._fresh = 0
        self._current = ceiling_s

    @classmethod
    def fixed(cls, timeout_s: float) -> LearnedTimeout:
        """A timeout that learns nothing: floor and ceiling are one."""
        return cls(timeout_s, timeout_s)

    def current(self) -> float:
        """The seconds a try sent now may take."""
        with self._lock:
            return self._current

    def sent(self, at: float | None = None) -> int:
        """A call went out (at `at` on the steady clock, now by default); its ticket for `ended`
        (a fixed timeout keeps none: it learns nothing)."""
        if self.floor_s == self.ceiling_s:
            return -1
        with self._lock:
            ticket = next(self._tickets)
            self._out[ticket] = time.monotonic() if at is None else at
            return ticket

    def ended(self, ticket: int, served_in: float | None, now: float | None = None) -> None:
        """The call of `ticket` ended: served in `served_in` seconds, or not served (None)."""
        if self.floor_s == self.ceiling_s:
            return
        with self._lock:
            self._out.pop(ticket, None)
            if served_in is None:
                return
            self._served.append(served_in)
            self._fresh += 1
            if self._fresh < REFRESH_EVERY or len(self._served) < MIN_SAMPLES:
                return
            self._fresh = 0
            now = time.monotonic() if now is None else now
            samples = [*self._served, *(now - sent for sent in self._out.values())]
            tail = statistics.quantiles(samples, n=100, method="inclusive")[QUANTILE - 1]
            self._current = min(self.ceiling_s, max(self.floor_s, MARGIN * tail))
