"""How many calls one AI endpoint takes at once, discovered while calling it.

Model APIs do not publish a stable concurrency limit: it moves with their load and the
account's tier and shows itself as 429 answers and as rising latency. This limiter is told
nothing about it; every try of an `AIClient` takes a permit and reports how it ended:

- a 429 is the service saying it is full: the calls still in flight are what it holds of ours,
  so the limit falls to that count. A 429 for a try sent after the last cut, within one
  latency of it and with a tenth fewer calls in flight than that cut left, means the service
  shrank further than what it held: the cut is then multiplicative (`backoff`), so a limit
  that halves costs a handful of 429s, not one per call.
  A `Retry-After` holds any growth until it has passed.
- a round's mean latency (a round: `limit` successful calls, at least MIN_ROUND) more than
  `latency_tolerance` times the lowest round mean seen (a service that queues instead of
  refusing) shrinks the limit by their ratio, at most by half: a gradient step, in the manner
  of Netflix's Gradient2.
- while the limit is in use (at least half of it, as Netflix's limiters count it) and nothing
  refuses, it grows: after a hold of `hold_rounds` rounds
  (`limit` successes each, one latency when saturated) by one call per round, the
  rate quadrupling every half round up to one call per success (doubling per latency). So a
  steady service sees one probing 429 every few rounds, and a service whose limit rose is
  found within a few latencies. Growth is paced (`_growth_token`), so calls that finish
  together cannot push a burst of probes past the service's limit. It starts at 20 calls,
  as Netflix's limiters do: a guess, not the service's limit.

One limiter serves every member of a fleet through its shared AI client, so the members
discover one limit per endpoint instead of each guessing a share.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

OK, OVERLOAD = "ok", "http_429"
SHRINK_SIGN = 0.9  # a refusal this far under the last cut's level means the service shrank
GROWTH_BURST = 8  # growth tokens saved: at most limit / GROWTH_BURST
MIN_ROUND = 32  # latencies averaged before comparing with the baseline: fewer are mostly noise


@dataclass(frozen=True)
class Permit:
    """One try's place in flight: the cut generation it was sent under, and when."""

    generation: int
    at: float


class AdaptiveLimit:
    """An in-flight limit for one endpoint; thread-safe, `acquire` blocks while it is reached."""

    def __init__(self, initial: int = 20, minimum: int = 1, maximum: int = 1024, backoff: float = 0.85,
                 hold_rounds: float = 2.0, latency_tolerance: float = 2.0,
                 clock: Callable[[], float] = time.time, history: int = 100_000) -> None:
        self.minimum, self.maximum = minimum, maximum
        self.backoff = backoff
        self.hold_rounds = hold_rounds
        self.latency_tolerance = latency_tolerance
        self._clock = clock
        self._cond = threading.Condition()
        self._limit = float(initial)
        self._in_flight = 0
        self._generation = 0
        self._cut_at = -math.inf
        self._cut_level = math.inf
        self._hold = 0.0  # successes to see before growing again
        self._hold_until = -math.inf  # Retry-After
        self._rate = 1.0  # limit growth per success while probing (starts as slow start)
        self._round_left = initial / 2
        self._tokens, self._tokens_at = 1.0, -math.inf
        self._min_latency: float | None = None
        self._round: list[float] = []  # latencies of the current round
        self._baseline: float | None = None  # lowest mean latency of a full round
        self._noted = -1
        # (at, limit, in flight) of each change, until collected (the fleet writes them down)
        self.changes: deque[tuple[float, float, int]] = deque(maxlen=history)
        self._note()

    @classmethod
    def fixed(cls, limit: int) -> AdaptiveLimit:
        """A limit that never moves (a published concurrency), shared the same way."""
        return cls(initial=limit, minimum=limit, maximum=limit)

    @property
    def limit(self) -> int:
        with self._cond:
            return int(self._limit)

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    def spare(self) -> int:
        """Permits free now: what a caller may start without waiting."""
        with self._cond:
            return max(0, int(self._limit) - self._in_flight)

    def acquire(self) -> Permit:
        with self._cond:
            while self._in_flight >= int(self._limit):
                self._cond.wait()
            self._in_flight += 1
            return Permit(self._generation, self._clock())

    def release(self, permit: Permit, outcome: str, retry_after_s: float | None = None) -> None:
        """The try of `permit` ended with `outcome` (an `ai_client.Try` outcome)."""
        with self._cond:
            now = self._clock()
            self._in_flight -= 1
            if outcome == OVERLOAD:
                self._overloaded(permit, now, retry_after_s)
            elif outcome == OK:
                self._succeeded(now - permit.at, now)
            self._cond.notify_all()

    def _overloaded(self, permit: Permit, now: float, retry_after_s: float | None) -> None:
        if retry_after_s:
            self._hold_until = max(self._hold_until, now + retry_after_s)
        if permit.generation != self._generation:
            # Sent before the last cut: the cut already answered it; one call fewer is held.
            self._set(min(self._limit, self._in_flight), now)
            return
        # Refused again within a latency of the cut that began this episode of refusals, holding a
        # tenth fewer calls than it left: the service shrank, not just our last probes were over.
        recent = self._min_latency is not None and now - self._cut_at < self._min_latency
        shrank = recent and self._in_flight < SHRINK_SIGN * self._cut_level
        target = self._in_flight * (self.backoff if shrank else 1.0)
        if target < self._limit:
            self._set(math.floor(target), now)
            self._generation += 1
            if not recent:
                self._cut_at, self._cut_level = now, self._limit
        self._start_hold()

    def _succeeded(self, latency: float, now: float) -> None:
        self._min_latency = latency if self._min_latency is None else min(self._min_latency, latency)
        self._round.append(latency)
        if len(self._round) >= max(self._limit, MIN_ROUND):
            mean = sum(self._round) / len(self._round)
            self._round.clear()
            self._baseline = mean if self._baseline is None else min(self._baseline, mean)
            if mean > self.latency_tolerance * self._baseline:
                self._cut(self._limit * max(0.5, self._baseline / mean), now)
                self._start_hold()
                return
        if 2 * (self._in_flight + 1) < self._limit:
            # Under half in use: this success says nothing about the limit. (Not "all in use":
            # replacements for calls that just ended are still on their way to `acquire`.)
            return
        if self._hold > 0 or now < self._hold_until:
            self._hold -= 1
            return
        if not self._growth_token(now):
            return
        self._set(self._limit + min(1.0, self._rate), now)
        self._round_left -= 1
        if self._round_left <= 0:
            self._rate = min(1.0, 4 * self._rate)
            self._round_left = self._limit / 2

    def _growth_token(self, now: float) -> bool:
        """Growth is paced: tokens come one per latency / limit / 2, at most limit / GROWTH_BURST
        of them saved, so a wave of calls ending together grows the limit by a few calls, not
        by as many probes past the service's limit as the wave had calls."""
        pace = (self._min_latency or 0.0) / max(self._limit, 1.0) / 2
        saved = max(1.0, self._limit / GROWTH_BURST)
        gained = (now - self._tokens_at) / pace if pace > 0 else saved
        self._tokens, self._tokens_at = min(saved, self._tokens + gained), now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _cut(self, value: float, now: float) -> None:
        self._set(value, now)
        self._generation += 1
        self._cut_at, self._cut_level = now, self._limit

    def _start_hold(self) -> None:
        self._hold = self.hold_rounds * self._limit
        self._rate = 1.0 / max(self._limit, 1.0)
        self._round_left = self._limit / 2

    def _set(self, value: float, now: float) -> None:
        self._limit = min(float(self.maximum), max(float(self.minimum), value))
        self._note(now)

    def _note(self, now: float | None = None) -> None:
        at = self._clock() if now is None else now
        if int(self._limit) != self._noted:
            self._noted = int(self._limit)
            self.changes.append((at, self._limit, self._in_flight))
