"""An AI endpoint's health, apart from any record's fault: a circuit its fleet's members share.

A request that keeps failing is dead-lettered only when the failure is its own. When the
endpoint fails for everyone (an outage: 5xx, timeouts or refused connections for every caller),
counting those failures against each request would turn a share of good traffic into dead
letters. The circuit tells the two apart from the calls of several requests at once:

- closed: calls go out. Once every one of the last SAMPLE calls that ended within WINDOW_S
  (fewer when fewer ended; 429s aside: they are the limiter's business) failed, and the failures
  belong to at least MIN_REQUESTS different requests, the endpoint is down for everyone: the
  circuit opens. Every one, not a share: an endpoint that fails 60 % of the calls still serves,
  and its requests' own failures dead-letter them after their tries (20 failures in a row at
  60 % come once in 27,000 windows); an outage fails them all.
- open: no call goes out; records wait as for any failing dependency, their tries not counted
  and their partitions held. After `open_s` (doubling with each failed probe, up to OPEN_MAX_S)
  it is half-open.
- half_open: one call at a time goes out, a probe. Its answer closes the circuit; its failure
  opens it again. A probe out longer than PROBE_PATIENCE latencies (the endpoint may hang rather
  than fail) lets the next probe go, so recovery is seen within a few latencies of it; the
  late failure of a probe so replaced is not counted again, so an endpoint that hangs is probed
  every PROBE_PATIENCE latencies rather than every OPEN_MAX_S (one call at a time either way).

A try's failure is the request's own only when it ends with the circuit closed and not as a
probe: failures that opened the circuit, or came back after it opened, are the endpoint's.
`serving()` says whether the endpoint serves others (closed, an answer within WINDOW_S): the
condition for calling a request's own failures its fault.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
# Outcomes that say the endpoint did not serve the call (a 4xx is an answer; a 429 a full slot).
DOWN_OUTCOMES = frozenset({"http_5xx", "timeout", "connection_error"})
NEUTRAL_OUTCOMES = frozenset({"http_429", "not_sent"})

SAMPLE = 20  # calls judged together: enough that scattered errors (10-60 %) do not look like an outage
MIN_REQUESTS = 3  # distinct failing requests: one request's failures are its own business
WINDOW_S = 30.0  # calls older than this say nothing of the endpoint now
# An outage is probed every OPEN_MAX_S at most: the endpoint's return is seen within that and a
# latency, a probe every 2 s costs nothing beside the calls held back.
OPEN_S = 0.5
OPEN_MAX_S = 2.0
PROBE_PATIENCE = 3.0  # latencies of a served call
MIN_PROBE_PATIENCE_S = 0.5


class Circuit:
    """The circuit of one endpoint; thread-safe. `changes` keeps (epoch s, state, detail) for
    the fleet to record."""

    def __init__(self, open_s: float = OPEN_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._state = CLOSED
        self._open_s = open_s
        self._base_open_s = open_s
        self._opened_at = 0.0
        self._ended: deque[tuple[float, str, bool]] = deque(maxlen=SAMPLE)  # (at, request, failed)
        self._served_at: float | None = None
        self._latency_s: float | None = None  # running mean of served calls
        self._probe: tuple[str, float] | None = None  # (request, sent at)
        self.openings = 0
        self.changes: deque[tuple[float, str, str]] = deque()

    @property
    def state(self) -> str:
        with self._lock:
            self._half_open_when_due()
            return self._state

    def admit(self, request: str) -> bool:
        """May `request`'s try go out now? In half-open, only as the probe."""
        with self._lock:
            self._half_open_when_due()
            if self._state == CLOSED:
                return True
            if self._state == OPEN:
                return False
            now = self._clock()
            if self._probe is None or self._probe[0] == request or now - self._probe[1] > self._patience():
                self._probe = (request, now)
                return True
            return False

    def closed_to(self, request: str) -> bool:
        """Would a try of `request` be refused now? Asked before a record takes its claim, so a
        record waiting for the endpoint writes nothing meanwhile; reserves no probe."""
        with self._lock:
            self._half_open_when_due()
            return self._state == OPEN or (
                self._state == HALF_OPEN and self._probe is not None and self._probe[0] != request
                and self._clock() - self._probe[1] <= self._patience())

    def ended(self, request: str, outcome: str, latency_s: float) -> bool:
        """Take a try's ending into account; True when its failure is the request's own."""
        if outcome in NEUTRAL_OUTCOMES:
            return False
        failed = outcome in DOWN_OUTCOMES
        with self._lock:
            now = self._clock()
            probe = self._probe is not None and self._probe[0] == request
            if not failed:
                self._served_at = now
                self._latency_s = (latency_s if self._latency_s is None
                                   else 0.8 * self._latency_s + 0.2 * latency_s)
                if self._state != CLOSED:
                    self._move(CLOSED, f"{request} answered")
                self._ended.append((now, request, False))
                return False
            if probe and self._state == HALF_OPEN:
                self._open_s = min(OPEN_MAX_S, 2 * self._open_s)
                self._move(OPEN, f"probe {request}: {outcome}")
                return False
            if self._state != CLOSED:
                return False
            self._ended.append((now, request, True))
            if self._down(now):
                self.openings += 1
                self._move(OPEN, f"{outcome}: {self._failing(now)} requests failing, no answer")
                return False
            return True

    def serving(self) -> bool:
        """The endpoint serves others: closed, and it answered a call within WINDOW_S."""
        with self._lock:
            self._half_open_when_due()
            return (self._state == CLOSED and self._served_at is not None
                    and self._clock() - self._served_at <= WINDOW_S)

    # ----------------------------------------------------------------- internals (lock held)
    def _down(self, now: float) -> bool:
        recent = [e for e in self._ended if now - e[0] <= WINDOW_S]
        return all(e[2] for e in recent) and self._failing(now) >= MIN_REQUESTS

    def _failing(self, now: float) -> int:
        return len({e[1] for e in self._ended if e[2] and now - e[0] <= WINDOW_S})

    def _half_open_when_due(self) -> None:
        if self._state == OPEN and self._clock() - self._opened_at >= self._open_s:
            self._move(HALF_OPEN, f"after {self._open_s:g} s open")

    def _patience(self) -> float:
        return max(MIN_PROBE_PATIENCE_S, PROBE_PATIENCE * (self._latency_s or 0.0))

    def _move(self, state: str, detail: str) -> None:
        self._state = state
        self._probe = None
        if state == OPEN:
            self._opened_at = self._clock()
        if state == CLOSED:
            self._ended.clear()
            self._open_s = self._base_open_s
        self.changes.append((time.time(), state, detail))
