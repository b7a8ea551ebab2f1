"""How many calls one AI endpoint takes at once, discovered while calling it.

Model APIs publish no stable concurrency limit: it moves with their load and the account's tier,
and shows as 429s at admission (or as latency, for a service that queues instead). Their latencies
are heavy-tailed, so one slow answer says nothing: the limit is learned from refusals, and from
latency only through window medians against a baseline. One limiter serves every member of a
fleet through its shared AI client. Budget refusals (a minute's requests or tokens spent) never
reach it: they say "later", not "fewer" (`consumers.ai.rate_budget`). A permit is held from
`acquire` (the limit counts it), but a call is counted at the endpoint only from `sent`: what the
caller does in between (its try put on record) is no call the endpoint holds. How it probes,
shrinks and backs off, why, and how it is checked: docs/adaptive.md.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from consumers.ai.call_timings import WINDOW, Latencies, RoundTrips

OK, OVERLOAD, NOT_SENT = "ok", "http_429", "not_sent"
# A round: as many calls ended as the limit (a mean latency, whatever the tail). A refused probe
# past the ceiling is one 429, so paced in rounds it is a share of the calls no tail can raise.
PROBE_EVERY = 3.0  # latencies between probes under the level to regain, at most, ...
PROBE_EVERY_S = 1.5  # ... and seconds, at least: a limit that came back is found within them, ...
LASTED_SHARE = 1 / 8  # ... or this share of the time the shrink has lasted: it may well last
FIRST_PROBE_WAIT = 0.25  # latencies before the probe after a first refused one under it
CEILING_EVERY = 6.0  # rounds between probes past it, once refused there time after time, ...
CEILING_EVERY_S = 30.0  # ... or seconds: a service that grew is found within them
CEILING_FIRST_WAIT = 4.0  # rounds before the probe after a first refused one there
STEP_SHARE = 1 / 16  # the largest step of a probe, as a share of the limit: what one may cost
BACKOFF = 0.5  # the cut when the service shrank or queues
ADMIT_TRIPS = 4  # a probe out this many 429 round trips unrefused was admitted
ADMIT_SHARE = 0.05  # ... until a 429 has measured the round trip: this share of the latency,
FIRST_TRIP_S = 0.1  # ... and no less than a hosted API's round trip (a loaded machine's too)
FIRST_STEP = 2.0  # the largest step until then: a first refusal late by R finds at most 2R/0.1 past
SHRINK_REFUSALS = 2  # refusals after an episode's first, far under what was answered: it shrank
TRANSIT_SPREAD = 2.0  # the calls on their way back, at the most, against their mean
STALL_ENDS = 8  # calls' share of the latency without one ending: stalled, no probe admitted


@dataclass(frozen=True)
class Permit:
    """One try's place in flight: the cut generation it was taken under, when it was taken or,
    once sent, sent; how many permits were held with it when taken (`held`) and, once sent, how
    many calls were sent and not back with it (`level`; both count itself)."""

    generation: int
    at: float
    held: int = 0
    level: int = 0
    sent: bool = False
    stepped: bool = False  # sent past the level a step was taken from: refused, the step pays


@dataclass
class _Probing:
    """Where probing stands: the level settled on (a call above it is a probe), the next step,
    the step out (taken from which limit, its first call once sent) and when, and waits."""

    floor: int
    step: float = 1.0
    taken_from: int | None = None
    first: Permit | None = None
    probed_at: float = -math.inf
    next_at: float = -math.inf  # no step before
    next_after: int = 0  # ... nor before this many calls have ended, unless `latest` has come
    latest: float = math.inf
    refused_wait: float = 0.0  # doubles with each refused probe, until the service shrinks
    regain: int = 0  # the level the service answered before it last shrank
    halved: int = 0  # the level that halving cut to
    shrank_at: float = -math.inf  # when: the longer a shrink has lasted, the rarer its probes

    def settle(self, level: int) -> None:
        """A new level settled on; no step out, the next three of one call each (a probe just
        past a cut may be admitted only because an answer in transit had freed its place)."""
        self.floor, self.step, self.taken_from, self.first = level, 0.25, None, None
        self.next_after, self.latest = 0, math.inf


@dataclass
class _Episode:
    """Refusals under the level settled on: when the first came, the highest level answered
    lately then, and how many since came further under it than the calls in transit explain."""

    began: float = -math.inf
    level: int = 0
    under: int = 0


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
        self._noted = -1  # the limit last written to `changes`
        self._generation = 0  # cuts so far: a try sent before the latest is told apart
        self._in_flight = 0  # permits held
        self._sent = 0  # calls sent and not back: what the endpoint may hold of ours
        self._waiting = 0
        self._ended_at = -math.inf  # when a call last ended
        self._ended = 0  # calls ended so far: refused probes are paced in rounds of the limit's calls
        self._plateau = 0  # the highest level a served call was sent at
        self._refused_level = math.inf  # the level of the last probe refused
        self._growing = False  # a call was served there since: the service grew
        self._answered: deque[tuple[float, int]] = deque(maxlen=WINDOW)  # (sent, level) of served calls
        self._latencies = Latencies()
        self._trips = RoundTrips()
        self._probing = _Probing(floor=initial)
        self._episode = _Episode()
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
            return Permit(self._generation, self._clock(), held=self._in_flight)

    def renew(self, permit: Permit) -> Permit:
        """The permit to hold for the try once its thread runs: `permit`, unless a cut came since
        it was taken (its thread may have waited to run meanwhile); then it is given back unsent
        and a new one waited for, so no try goes into a service that just refused one."""
        with self._cond:
            if permit.generation == self._generation:
                return permit
        self.release(permit, NOT_SENT)
        return self.acquire()

    def sent(self, permit: Permit) -> Permit:
        """`permit`'s try goes out now: counted at the endpoint from here, at the level of the
        calls sent with it. The first sent past the step's level is its probe, and a refusal of
        any call sent past it is the step's: a permit taken past it may go out at a lower level
        (others held, their records being written), and its silence would say nothing of the
        level probed, its refusal nothing of the step."""
        with self._cond:
            self._sent += 1
            probing = self._probing
            stepped = probing.taken_from is not None and self._sent > probing.taken_from
            sent = Permit(permit.generation, self._clock(), permit.held, self._sent, True, stepped)
            if stepped and probing.first is None:
                probing.first, probing.probed_at = sent, sent.at
            return sent

    def release(self, permit: Permit, outcome: str, retry_after_s: float | None = None) -> None:
        """The try of `permit` ended with `outcome` (an `ai_client.Try` outcome; OVERLOAD only
        for a concurrency refusal)."""
        with self._cond:
            now = self._clock()
            self._in_flight -= 1
            self._sent -= permit.sent
            self._ended_at, self._ended = now, self._ended + 1
            if outcome == OVERLOAD:
                self._refused(permit, now, retry_after_s)
            elif outcome == OK:
                self._served(permit, now)
            self._tick(now, wanted=self._waiting > 0)
            # Wake only as many waiters as may go on, not every worker of a stage.
            self._cond.notify(max(0, int(self._limit) - self._in_flight))

    # -- what a try's end teaches

    def _served(self, permit: Permit, now: float) -> None:
        """A served call: its latency, its level (with the calls still in flight: one sent first
        in a burst has a level of 1), a probe admitted, a queue seen in the window medians."""
        window_closed = self._latencies.add(now - permit.at)
        self._answered.append((permit.at, max(permit.level, self._sent + 1)))
        self._plateau = max(self._plateau, permit.level)
        self._growing = self._growing or permit.level >= self._refused_level
        if permit is self._probing.first:
            self._admitted(now)
        if window_closed and self._latencies.queued(self.latency_tolerance):
            self._cut(BACKOFF * self._limit, now)
            self._probing.next_at = now + self._latency()

    def _refused(self, permit: Permit, now: float, retry_after_s: float | None) -> None:
        self._trips.add(now - permit.at)
        if permit.generation != self._generation:
            # Sent before the latest cut, which answered it already; but a refused call freed
            # no place at the service, so its permit goes to no other call. Far under what the
            # service answered, it says the service shrank as much as a call sent after.
            self._set(min(self._limit, float(self._sent)), now)
            self._probing.floor = min(self._probing.floor, int(self._limit))
            if self._shrank(permit, now, opens=False):
                self._halve(now)
            return
        if permit.stepped or self._after_probe(permit):
            probe = self._probing.first or permit
            # Served there once, with calls in transit; refused now: not a level to take for
            # admitted by time alone.
            self._plateau = min(self._plateau, probe.level - 1)
            self._refused_level = probe.level
            self._probing.probed_at = -math.inf  # one refusal pays for a probe
            self._probe_refused(now, retry_after_s, untried=permit.level - 1 > self._probing.floor)
        else:
            self._settled_level_refused(permit, now, retry_after_s)

    def _probe_refused(self, now: float, retry_after_s: float | None, untried: bool) -> None:
        """A probe's step went past what the service holds: back to the level settled on (the
        step's other calls are stale by then), and the next probe waits twice longer than after
        the last refused one: up to PROBE_EVERY latencies under the level to regain (less the
        calls in transit, which it counted), where a service that shrank comes back within
        seconds; up to CEILING_EVERY rounds with nothing to regain, where each probe that finds
        no growth costs a 429. Back more than
        halfway to the level to regain, nothing is left to regain (it may be a level counted with
        answers in transit, never held); a refused step of more than one call (`untried`) leaves
        the levels under its top to probe soon (docs/adaptive.md says why)."""
        self._cut(self._probing.floor, now)
        probing = self._probing
        if probing.regain and 2 * probing.floor > probing.halved + probing.regain:
            probing.regain = 0  # and the next probe waits no less than at a first refusal there
            probing.refused_wait = max(probing.refused_wait, CEILING_FIRST_WAIT / 2)
        if untried:
            probing.next_at = now + max(retry_after_s or 0.0, FIRST_PROBE_WAIT * self._latency())
        elif probing.floor + self._in_transit() >= probing.regain:  # at the ceiling
            probing.refused_wait = min(CEILING_EVERY, 2 * probing.refused_wait or CEILING_FIRST_WAIT)
            self._wait(now, retry_after_s or 0.0, rounds=probing.refused_wait, longest=CEILING_EVERY_S)
        else:
            probing.refused_wait = min(PROBE_EVERY, 2 * probing.refused_wait or FIRST_PROBE_WAIT)
            longest = max(PROBE_EVERY_S, LASTED_SHARE * (now - probing.shrank_at))
            wait = min(probing.refused_wait * self._latency(), longest)
            probing.next_at = now + max(retry_after_s or 0.0, wait)

    def _wait(self, now: float, seconds: float, rounds: float, longest: float = math.inf) -> None:
        """The next step no sooner than `seconds` from now, nor before `rounds` of the limit's
        calls have ended (a refused probe's 429 is then that share of the calls whatever the
        latencies' tail), unless `longest` has passed."""
        probing = self._probing
        probing.next_at, probing.latest = now + seconds, now + longest
        probing.next_after = self._ended + math.ceil(rounds * self._limit)

    def _after_probe(self, permit: Permit) -> bool:
        """`permit`'s call went out after the last probe, within a latency: at a full service the
        probe may have taken the place a call of ours had just freed (its answer still on its
        way), and the call after it pays for the probe."""
        return 0 <= permit.at - self._probing.probed_at <= self._latency()

    def _settled_level_refused(self, permit: Permit, now: float, retry_after_s: float | None) -> None:
        """Not a probe: the service no longer holds the level settled on, or fewer of our calls
        were on their way back than when it settled. When it shrank, the limit is halved (as AIMD
        does) and probing finds the rest; otherwise it comes down to the calls sent and not
        back, what the service holds of ours (the refused call's own level says less when calls
        went out together: the first of eight was refused at 1)."""
        if self._shrank(permit, now, opens=True):
            self._halve(now)
            return
        self._cut(self._sent, now)
        wait = max(self._probing.refused_wait, FIRST_PROBE_WAIT) * self._latency()
        self._probing.next_at = now + max(retry_after_s or 0.0, min(wait, PROBE_EVERY_S))

    def _halve(self, now: float) -> None:
        """The service shrank: half the level it held (the level answered, less the calls in
        transit), probed from at once, and the level answered to regain."""
        self._probing.regain, self._probing.shrank_at = self._episode.level, now
        self._cut(BACKOFF * (self._episode.level - self._in_transit() + 1), now)
        self._probing.halved = int(self._limit)
        self._episode.began, self._probing.next_at, self._probing.refused_wait = -math.inf, now, 0.0

    def _shrank(self, permit: Permit, now: float, opens: bool) -> bool:
        """Count the refusal into its episode: the service shrank when, within a latency of the
        episode's first, SHRINK_REFUSALS more came further under the highest level it had
        answered lately than the calls in transit explain (not under the level settled on: a
        probe taken for admitted while calls on their way back had freed its place raises that
        past what the service holds)."""
        latency, episode = self._latency(), self._episode
        if now - episode.began > latency:
            if not opens:
                return False
            episode.began, episode.level, episode.under = now, self._answered_level(now, latency), 0
        elif permit.level <= episode.level - self._in_transit():
            episode.under += 1
        return episode.under >= SHRINK_REFUSALS

    def _answered_level(self, now: float, latency: float) -> int:
        """The highest level the service answered among the calls sent in the last two
        latencies (the level settled on when none was)."""
        return max((level for at, level in self._answered if at >= now - 2 * latency),
                   default=self._probing.floor)

    def _admitted(self, now: float) -> None:
        """The probe step was taken by the service: the next one at once, twice as large, but
        landing on the level to regain, or else on the highest level served, and past that, once
        the service has refused a call, one call at a time: a step of eight past what the
        service holds is eight 429s."""
        probing = self._probing
        mark = probing.regain if probing.floor < probing.regain else self._plateau
        probing.floor = int(self._limit)
        probing.taken_from, probing.first = None, None
        largest = max(1.0, STEP_SHARE * self._limit)
        if self._trips.mean is None:
            largest = min(largest, FIRST_STEP)
        probing.step = min(2 * probing.step, largest)
        if self._limit < mark:
            probing.step = min(probing.step, mark - self._limit)
        elif self._trips.mean is not None and not self._growing:
            probing.step = 1.0
        probing.next_at, probing.next_after, probing.latest = now, 0, math.inf

    # -- time moves on

    def _tick(self, now: float, wanted: bool) -> None:
        """What time alone decides: a probe out unrefused long enough, the next step when
        callers want one."""
        if self._probe_held(now):
            self._admitted(now)
        if wanted and self._may_step(now):
            self._probing.taken_from = int(self._limit)
            self._set(self._limit + max(1.0, self._probing.step), now)

    def _probe_held(self, now: float) -> bool:
        """The step's first call is out unrefused long enough (a service refuses at admission),
        while calls keep ending; once the service has refused a call, only at a level it served
        before (a late refusal there would take the limit past anything it has shown)."""
        probe = self._probing.first
        return (probe is not None and now - probe.at >= self._admit_wait() and not self._stalled(now)
                and (self._trips.mean is None or self._growing
                     or probe.level <= max(self._plateau, self._probing.regain)))

    def _may_step(self, now: float) -> bool:
        """A step may be taken: none out, its time come, an answer seen (before one a step
        would be blind), the limit in use, and the service not slowed, unless the step is a
        return to a level it held: a window of heavy-tailed latencies over the baseline then
        held the limit under the service for seconds."""
        probing = self._probing
        return (probing.taken_from is None and now >= probing.next_at
                and (self._ended >= probing.next_after or now >= probing.latest)
                and bool(self._latencies.recent) and self._in_flight >= int(self._limit)
                and (self._limit < self._probing.regain or not self._latencies.slowed()))

    def _due(self) -> float | None:
        """When time alone may let a waiting caller go on."""
        probing = self._probing
        if probing.first is not None:
            return probing.first.at + self._admit_wait()
        if probing.taken_from is None:
            now = self._clock()
            if probing.next_at > now:
                return probing.next_at
            if self._ended < probing.next_after and now < probing.latest < math.inf:
                return probing.latest  # else a call's end wakes the waiters
        return None

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
        if not latency:
            return 1
        return 1 + math.ceil(TRANSIT_SPREAD * self._limit * (self._trips.mean or 0.0) / latency)

    def _latency(self) -> float:
        """The median latency of the recent calls: the time unit of waits."""
        return self._latencies.median()

    def _admit_wait(self) -> float:
        """How long a probe goes unrefused before it was admitted: a few 429 round trips, and
        no less than the longest of the recent ones (on a loaded machine a refusal waits for a
        CPU here as long as it took to come), or a share of the latency until one has been
        measured, and no less than FIRST_TRIP_S (its round trip unknown, the climb is blind: a
        refusal that comes back late finds the limit that many steps past the service)."""
        if self._trips.mean is not None:
            return max(ADMIT_TRIPS * self._trips.mean, self._trips.longest())
        return max(ADMIT_SHARE * self._latency(), FIRST_TRIP_S) if self._latencies.recent else math.inf

    def _cut(self, value: float, now: float) -> None:
        """A lower limit; tries sent from now on are told apart from those sent before."""
        self._set(value, now)
        self._generation += 1
        self._growing = False
        self._probing.settle(int(self._limit))

    def _set(self, value: float, now: float) -> None:
        self._limit = min(float(self.maximum), max(float(self.minimum), value))
        if int(self._limit) != self._noted:
            self._noted = int(self._limit)
            self.changes.append((now, self._limit, self._in_flight))
