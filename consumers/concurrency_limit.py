"""How many calls one AI endpoint takes at once, discovered while calling it.

Model APIs do not publish a stable concurrency limit: it moves with their load and the
account's tier, and shows itself as 429s at admission (or, for a service that queues instead,
as latency that rises with the calls in flight). Their latencies are heavy-tailed, so a slow
answer says nothing about a full service; the limiter learns from refusals, and from latency
only through a robust statistic (medians over windows of calls) against a baseline.

Every try of an `AIClient` takes a permit carrying its level (the calls in flight with it) and
its generation (how many cuts came before it), renews it as it goes out, and reports how it
ended. A 429 for a call sent before the latest cut is stale: that cut already answered it.

- **Probing up.** While callers want more than the limit allows, the limit is raised by a
  step; a call sent above the level last settled on is a probe. A service refuses a call as
  soon as it sees it, so a probe out for a few 429 round trips unrefused (or answered) while
  other calls keep ending (in a stall its refusal may be late) was admitted: the next step
  follows at once, doubling up to a sixteenth of the limit. Once the service has refused a
  call, a probe above the highest level it ever served counts as admitted only once it is
  served: a late refusal there would take the limit past anything the service has shown (from
  65 to 96 within 100 ms on a loaded machine). A refused probe goes back to the level settled
  on, and the next probe waits, twice longer after each refused one, up to PROBE_EVERY
  latencies or PROBE_EVERY_S, whichever is sooner: at a steady limit that is the price, one
  429 that often (half a percent of the calls at 64 in flight), and a limit that came back is
  found within as long.
- **Shrinking.** A refusal at or under the level settled on (not a probe's) cuts the limit to
  the calls still in flight. Refused twice more within a latency, further under the highest
  level the service answered lately than the calls on their way back could explain (a client
  on a loaded machine counts calls its threads have not sent yet), it shrank: the
  limit is halved, as AIMD does, no call is sent until the calls in flight are under it, and
  probing finds the rest. A service that halves costs four or five 429s, not one per call in
  flight.
- **Queueing.** With the median latency of the last two windows over `latency_tolerance` times
  the baseline (the lowest window median of the last BASELINE_WINDOWS), calls wait at the
  service: the limit is halved, and does not grow while the median is over GROWTH_TOLERANCE of the
  baseline.

Budget refusals (a minute's requests or tokens spent) are not concurrency and never reach it:
`consumers.rate_budget` paces those. One limiter serves every member of a fleet through its
shared AI client, so the members discover one limit per endpoint instead of each guessing.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

OK, OVERLOAD, NOT_SENT = "ok", "http_429", "not_sent"
PROBE_EVERY = 3.0  # latencies between probes past a limit the service keeps refusing, ...
PROBE_EVERY_S = 6.0  # ... and seconds: a limit that came back is found within them
FIRST_PROBE_WAIT = 0.25  # latencies before the probe after a first refused one
STEP_SHARE = 1 / 16  # the largest step of a probe, as a share of the limit: what one may cost
BACKOFF = 0.5  # the cut when the service shrank or queues
ADMIT_TRIPS = 4  # a probe out this many 429 round trips unrefused was admitted
ADMIT_SHARE = 0.05  # ... until a 429 has measured the round trip: this share of the latency
TRIP_WEIGHT = 0.2  # each 429's weight in the running mean of their round trips
RECENT_TRIPS = 16  # 429 round trips whose longest a probe waits out too
SHRINK_REFUSALS = 2  # refusals after an episode's first, far under what was answered: it shrank
TRANSIT_SPREAD = 2.0  # the calls on their way back, at the most, against their mean
STALL_ENDS = 8  # calls' share of the latency without one ending: stalled, no probe admitted
WINDOW = 64  # latencies per median: over fewer, a heavy tail moves it by tens of percent
BASELINE_WINDOWS = 10  # window medians the baseline is the lowest of (it follows a slower service)
GROWTH_TOLERANCE = 1.5


@dataclass(frozen=True)
class Permit:
    """One try's place in flight: the cut generation it was sent under, when, and how many
    calls were in flight with it (itself included)."""

    generation: int
    at: float
    level: int = 0


class AdaptiveLimit:
    """An in-flight limit for one endpoint; thread-safe, `acquire` blocks while it is reached."""

    def __init__(self, initial: int = 20, minimum: int = 1, maximum: int = 1024,
                 latency_tolerance: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 history: int = 100_000) -> None:
        self.minimum, self.maximum = minimum, maximum
        self.latency_tolerance = latency_tolerance
        self._clock = clock
        self._cond = threading.Condition()
        self._limit = float(initial)
        self._in_flight = 0
        self._waiting = 0
        self._ended_at = -math.inf  # when a call last ended
        self._plateau = 0  # the highest level a served call was sent at
        self._generation = 0
        self._floor = initial  # the level last settled on: a call above it is a probe
        self._step = 1.0
        self._probe_from: int | None = None  # the limit a probe step was taken from
        self._probe: Permit | None = None  # the first call of that step, once sent
        self._probe_at = -math.inf  # when the next step may be taken
        self._probe_wait = 0.0  # latencies to wait after a refused probe (doubles until it shrinks)
        self._episode_at, self._episode_level = -math.inf, 0  # the first refusal under the floor
        self._under = 0  # refusals since, further under that level than the calls in transit
        self._answered: deque[tuple[float, int]] = deque(maxlen=WINDOW)  # (sent, level) of served calls
        self._trip: float | None = None  # mean round trip of a 429
        self._trips: deque[float] = deque(maxlen=RECENT_TRIPS)
        self._latencies: deque[float] = deque(maxlen=WINDOW)
        self._fresh = 0  # latencies since the last window median
        self._windows = 0
        self._medians: deque[float] = deque(maxlen=BASELINE_WINDOWS)
        self._noted = -1
        # (at, limit, in flight) of each change until collected (the fleet writes them down);
        # `at` is a reading of `clock`, steady: the wall clock jumps
        self.changes: deque[tuple[float, float, int]] = deque(maxlen=history)
        self._set(self._limit, clock())

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
            self._tick(self._clock(), wanted=True)
            return max(0, int(self._limit) - self._in_flight)

    def acquire(self) -> Permit:
        with self._cond:
            self._waiting += 1
            try:
                self._tick(self._clock(), wanted=True)
                while self._in_flight >= int(self._limit):
                    due = self._due()
                    self._cond.wait(None if due is None else max(0.001, due - self._clock()))
                    self._tick(self._clock(), wanted=True)
            finally:
                self._waiting -= 1
            self._in_flight += 1
            permit = Permit(self._generation, self._clock(), self._in_flight)
            if self._probe_from is not None and self._probe is None and permit.level > self._probe_from:
                self._probe = permit
            return permit

    def renew(self, permit: Permit) -> Permit:
        """The permit to send the try with, just before it is sent: `permit`, unless a cut came
        since it was taken (its thread may have waited to run meanwhile); then it is given back
        unsent and a new one waited for, so no try goes into a service that just refused one."""
        with self._cond:
            if permit.generation == self._generation:
                return permit
        self.release(permit, NOT_SENT)
        return self.acquire()

    def release(self, permit: Permit, outcome: str, retry_after_s: float | None = None) -> None:
        """The try of `permit` ended with `outcome` (an `ai_client.Try` outcome; OVERLOAD only
        for a concurrency refusal)."""
        with self._cond:
            now = self._clock()
            self._in_flight -= 1
            self._ended_at = now
            if outcome == OVERLOAD:
                self._refused(permit, now, retry_after_s)
            elif outcome == OK:
                self._served(permit, now)
            self._tick(now, wanted=self._waiting > 0)
            # Wake only as many waiters as may go on, not every worker of a stage.
            self._cond.notify(max(0, int(self._limit) - self._in_flight))

    # -- what a try's end teaches

    def _served(self, permit: Permit, now: float) -> None:
        self._latencies.append(now - permit.at)
        # (the calls still in flight with it too: one sent first in a burst has a level of 1)
        self._answered.append((permit.at, max(permit.level, self._in_flight + 1)))
        self._plateau = max(self._plateau, permit.level)
        self._fresh += 1
        if permit is self._probe:
            self._admitted(now)
        if self._fresh >= WINDOW:
            # Calls end shortest first: the first window after a burst starts, or after the
            # calls sent change, takes the fast ones of many and the slow ones of few. So the
            # first window is no baseline, and one window over the tolerance is no queue.
            self._fresh, self._windows = 0, self._windows + 1
            if self._windows == 1:
                return
            self._medians.append(self._latency())
            if len(self._medians) > 2 and min(self._medians[-1], self._medians[-2]) \
                    > self.latency_tolerance * min(self._medians):
                self._cut(BACKOFF * self._limit, now)
                self._probe_at = now + self._latency()

    def _refused(self, permit: Permit, now: float, retry_after_s: float | None) -> None:
        trip = now - permit.at
        self._trip = trip if self._trip is None else self._trip + TRIP_WEIGHT * (trip - self._trip)
        self._trips.append(trip)
        if permit.generation != self._generation:
            return  # sent before the latest cut, which answered it already
        latency = self._latency()
        if permit.level > self._floor:
            # A probe's step went past what the service holds: back to the level settled on
            # (the step's other calls, on their way to the same answer, are stale by then; the
            # highest answered lately would be lower still, its calls at the step's last levels
            # not back yet: a return from 32 to 64 fell back to 60 and took 6 s per call back).
            self._cut(self._floor, now)
            self._probe_wait = min(PROBE_EVERY, 2 * self._probe_wait or FIRST_PROBE_WAIT)
            self._probe_at = now + max(retry_after_s or 0.0, self._wait(self._probe_wait))
            return
        # Not a probe: the service no longer holds the level settled on, or the calls on their
        # way back to us (counted here, gone there) were fewer than when it settled. Refused
        # again within a latency, further under the highest level the service answered lately
        # than those calls: it shrank. (Not the level settled on: a probe taken for admitted
        # while calls on their way back had freed its place raises that past what it holds.)
        if now - self._episode_at > latency:
            self._episode_at, self._episode_level, self._under = now, self._answered_level(now, latency), 0
        elif permit.level <= self._episode_level - self._in_transit():
            self._under += 1
        if self._under >= SHRINK_REFUSALS:
            self._cut(BACKOFF * self._episode_level, now)
            self._episode_at, self._probe_at, self._probe_wait = -math.inf, now, 0.0
            return
        # The calls still in flight are what the service holds of ours (the refused one's own
        # level says less when calls went out together: the first of eight was refused at 1).
        self._cut(self._in_flight, now)
        self._probe_at = now + max(retry_after_s or 0.0, self._wait(max(self._probe_wait, FIRST_PROBE_WAIT)))

    def _answered_level(self, now: float, latency: float) -> int:
        """The highest level the service answered among the calls sent in the last two
        latencies (the level settled on when none was)."""
        return max((level for at, level in self._answered if at >= now - 2 * latency), default=self._floor)

    def _admitted(self, now: float) -> None:
        """The probe step was taken by the service: the next one at once, twice as large."""
        self._floor = int(self._limit)
        self._probe_from, self._probe = None, None
        self._step = min(2 * self._step, max(1.0, STEP_SHARE * self._limit))
        self._probe_at = now

    # -- time moves on

    def _tick(self, now: float, wanted: bool) -> None:
        """What time alone decides: a probe out unrefused long enough, the next step when
        callers want one."""
        if self._probe is not None and now - self._probe.at >= self._admit_wait() and not self._stalled(now) \
                and (self._trip is None or self._probe.level <= self._plateau + self._in_transit()):
            self._admitted(now)
        if self._probe_from is not None or not wanted or now < self._probe_at or not self._latencies:
            return  # (before any answer, a step would be blind)
        if self._in_flight < int(self._limit) or self._queueing():
            return
        self._probe_from = int(self._limit)
        self._set(self._limit + self._step, now)

    def _due(self) -> float | None:
        """When time alone may let a waiting caller go on."""
        if self._probe is not None:
            return self._probe.at + self._admit_wait()
        if self._probe_from is None and self._probe_at > self._clock():
            return self._probe_at
        return None

    def _wait(self, latencies: float) -> float:
        """Seconds until the next probe: `latencies`, at most PROBE_EVERY_S."""
        return min(latencies * self._latency(), PROBE_EVERY_S)

    def _stalled(self, now: float) -> bool:
        """No call has ended for STALL_ENDS calls' share of the latency: this process or the
        service is held up (a loaded machine), and a probe's refusal may be on its way however
        long it has been out."""
        gap = STALL_ENDS * self._latency() / max(self._in_flight, 1)
        return now - self._ended_at > max(gap, self._admit_wait())

    def _in_transit(self) -> int:
        """Calls a level may count that the service does not hold: those answered and on their
        way back (the limit's calls end limit / latency a second, each a 429 round trip on its
        way; twice that, as round trips spread), and one."""
        latency = self._latency()
        return 1 + math.ceil(TRANSIT_SPREAD * self._limit * (self._trip or 0.0) / latency) if latency else 1

    def _queueing(self) -> bool:
        return bool(self._medians) and self._medians[-1] > GROWTH_TOLERANCE * min(self._medians)

    def _latency(self) -> float:
        """The median latency of the recent calls: the time unit of waits (a mean would follow
        the tail)."""
        return statistics.median(self._latencies) if self._latencies else 0.0

    def _admit_wait(self) -> float:
        """How long a probe goes unrefused before it was admitted: a few 429 round trips, and
        no less than the longest of the recent ones (on a loaded machine a refusal waits for a
        CPU here as long as it took to come), or a share of the latency until one has been
        measured."""
        if self._trip is not None:
            return max(ADMIT_TRIPS * self._trip, max(self._trips))
        return ADMIT_SHARE * self._latency() if self._latencies else math.inf

    def _cut(self, value: float, now: float) -> None:
        """A lower limit; tries sent from now on are told apart from those sent before."""
        self._set(value, now)
        self._generation += 1
        self._floor = int(self._limit)
        self._step = 1.0
        self._probe_from, self._probe = None, None

    def _set(self, value: float, now: float) -> None:
        self._limit = min(float(self.maximum), max(float(self.minimum), value))
        if int(self._limit) != self._noted:
            self._noted = int(self._limit)
            self.changes.append((now, self._limit, self._in_flight))
