"""How many calls one AI endpoint takes at once, discovered while calling it.

Model APIs do not publish a stable concurrency limit: it moves with their load and the
account's tier and shows itself as 429 answers and as rising latency. This limiter is told
nothing about it; every try of an `AIClient` takes a permit, renews it as it goes out (one
taken before a cut is given back and waited for again) and reports how it ended:

- a 429 is the service saying it is full: the calls still in flight are what it holds of ours,
  so the limit falls to that count. Every permit carries its level (the calls in flight with
  it). A 429 a tenth and the margin (below) under a level the service has served since the
  last cut, or, within one latency of the first 429, with a tenth and the margin fewer calls
  in flight than when it came, or the third 429 in that latency at levels up to the highest
  the service had served or held when it began (each call that ends is replaced and refused: a
  service that shrank with our calls in flight), means the service shrank: the cut is then
  multiplicative (`backoff`), so a limit that halves costs a handful of 429s, not one per
  call. (Tries sent before that first 429 came back, blind past the limit, or within a round
  trip after it, their place at the service taken by those, do not count as fewer calls held.)
  The level held before it shrank is kept as the plateau. A `Retry-After` holds any growth
  until it has passed.
- for a 429's round trip after the first of an episode (outside a plateau) no call that ends
  is replaced: the 429s of calls sent before it came back are still on their way, and had the
  service shrunk, it would refuse every replacement too (a dozen 429s at a bench run's cut,
  three to five since). Those late 429s count: the third at a level the service had served is
  a shrink, and the cut applies to the calls the service would hold had the ended ones been
  replaced. When nothing says it shrank, the limit comes back to that level in steps, one call
  more than in flight and doubling each 429 round trip, so a shrink the drain did not see is
  told by the first step's refusal, not by as many as the calls that ended meanwhile.
- the margin allows for the calls in transit: answers that have left the service but are not
  released here yet, and calls acquired here that have not reached it. A level counts them, so
  the service holds one or two fewer than a level says, more or fewer from one try to the next:
  one try may be served and the next refused at the same level with the service unchanged, and
  levels closer than that say nothing of it. (Compared without it, a steady service's limit
  was halved, and a plateau the service no longer held was returned to, tens of 429s at once.)
  Each 429 measures it: the calls served that ended while it was out (a 429 comes back as soon
  as the service has seen the call, so its round trip is the way there and back; refused ones
  do not count: 20 refusals coming back together counted each other, and a margin of 18 calls
  kept a bench run's limit from telling that its service had grown back). The margin is their
  running mean rounded up, at least one call: even a few ms put a call on its way now and then.
- a round's mean latency (a round: `limit` successful calls sent since the last cut, at least
  MIN_ROUND) more than
  `latency_tolerance` times the lowest round mean seen (a service that queues instead of
  refusing) shrinks the limit by their ratio, at most by half: a gradient step, in the manner
  of Netflix's Gradient2.
- under a plateau, probes go out as soon as the Retry-After allows, up to the margin above the
  lowest refused level. When the service serves one that far above it (discounting the refused
  tries that were in flight with it, which it never held), or has not refused it within a few
  round trips of a 429 (`_step_wait`; a service refuses a call as soon as it sees it, so one
  it has kept is admitted, a latency before its answer says so), the service grew back: the
  limit returns to the plateau, at most twice the level served, in steps that double each time
  a refusal would be back (a probe can be served by chance, see `_step_back`). Limits that
  move between tiers are followed within a few latencies, at the price of a 429 or two per
  latency while the service stays low.
- otherwise, while the limit is in use (at least half of it, as Netflix's limiters count it),
  nothing refuses and the latency averaged over the last MIN_ROUND calls is within
  GROWTH_TOLERANCE of its lowest (else calls queue, at the service or for this process's CPU,
  and more of them in flight would only wait), it grows, on successes of tries sent since the
  last cut (those sent before it held the level of before): after a hold of `hold_rounds`
  rounds (`limit` successes each, one latency when saturated) by one call per round, the rate
  quadrupling every half round up to one call per success (doubling per latency). So a steady
  service sees one probing 429 every five rounds or so: with a hold of two, one every three, a
  third of a bench run's 429s. Growth is paced (`_growth_token`), so calls that finish
  together cannot push a burst of probes past the service's limit, and once a 429 has been
  seen a step waits a few 429 round trips after the last, so the refusal of a step past the
  limit is back before the next goes out; and a step waits until the last one has been taken
  (a call acquired at the limit), since a caller starts a call a while after a permit frees
  (its record dispatched, its rows written): steps that ran ahead of the calls took the limit
  from 64 to 89 before the first refusal of a step past 64 was back. Until a 429 has measured
  that round trip, growth doubles at most every BLIND_DOUBLING, in steps BLIND_GAP apart. It
  starts at 20 calls, as Netflix's limiters do: a guess, not the service's limit.

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

OK, OVERLOAD, NOT_SENT = "ok", "http_429", "not_sent"
SHRINK_SIGN = 0.9  # a refusal this far under the last cut's level means the service shrank
SHRINK_REFUSALS = 3  # refusals in one episode at levels the service served: it shrank
# Refusals further apart than this share of a latency are not one episode: a steady probe's 429
# 2.96 s before a service of 3 s calls halved took the halving's first refusals into its episode,
# and the count of them started over when that episode's latency was out.
EPISODE_GAP = 0.25
ADMIT_TRIPS = 4  # a probe out this many 429 round trips unrefused was admitted
ADMIT_SHARE = 0.05  # ... and at least this share of the lowest latency
BLIND_DOUBLING = 1.5  # seconds: the fastest growth until a 429's round trip is known
BLIND_GAP = 0.02  # seconds between steps of growth until then
GROWTH_BURST = 8  # growth tokens saved: at most limit / GROWTH_BURST
PROBE_PATIENCE = 8  # probes under the plateau refused before the wait between them grows
MIN_ROUND = 32  # latencies averaged before comparing with the baseline: fewer are mostly noise
GROWTH_TOLERANCE = 1.3  # latency this much over its lowest running mean: calls queue, no growth
TRANSIT_WEIGHT = 0.2  # weight of each 429 in the running means of its round trip and of the calls in transit


@dataclass(frozen=True)
class Permit:
    """One try's place in flight: the cut generation it was sent under, when, how many calls
    were in flight with it (itself included) and how many tries had been served before it."""

    generation: int
    at: float
    level: int = 0
    served: int = 0


class AdaptiveLimit:
    """An in-flight limit for one endpoint; thread-safe, `acquire` blocks while it is reached."""

    def __init__(self, initial: int = 20, minimum: int = 1, maximum: int = 1024, backoff: float = 0.5,
                 hold_rounds: float = 4.0, latency_tolerance: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, history: int = 100_000) -> None:
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
        self._held = 0  # the highest level served among the tries sent since the last cut
        self._refusals: deque[tuple[float, float]] = deque()  # (sent, refused) of recent 429s
        self._refused = math.inf  # the lowest level refused since the service last grew
        self._plateau = 0.0  # the level held before the service shrank, until it grows again
        self._probes = 0  # probes under the plateau refused in a row
        self._probe_out: Permit | None = None  # the probe in flight, until it ends
        self._episode_held = 0  # the highest level served when the episode of refusals began
        self._episode_refusals = 0  # refusals in the episode at levels up to that one
        self._min_latency: float | None = None
        self._served = 0  # tries served
        self._trip = 0.0  # mean round trip of a 429
        self._transit: float | None = None  # mean calls served while a 429 was out: the calls in transit
        self._grown_at = -math.inf
        self._filled = True  # a call was acquired at the limit since it last grew
        self._drain_until = -math.inf  # after an episode's first 429: calls that end are not replaced
        self._drain_level: float | None = None  # the limit once the drain is over, unless cut
        self._drain_step, self._step_at = 1.0, -math.inf  # the return to it: next step and when
        self._returning: float | None = None  # the level the service grew back to, until reached
        self._return_step, self._return_at = 1.0, -math.inf  # the way back to it: next step and when
        self._round: list[float] = []  # latencies of the current round
        self._baseline: float | None = None  # lowest mean latency of a full round
        self._smoothed: float | None = None  # latency averaged over about MIN_ROUND calls
        self._smoothed_n = 0
        self._smoothed_low = math.inf  # its lowest once it averages MIN_ROUND calls
        self._noted = -1
        # (at, limit, in flight) of each change, until collected (the fleet writes them down);
        # `at` is a reading of `clock`, steady: the wall clock jumps, and its deadlines would too
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
                # A probe out or a return under way moves on with time, not only as calls end:
                # calls sent together end together, a latency apart, and a bench run's probe was
                # taken for admitted only at the next wave, 2.7 s after it could have been.
                due = self._due()
                self._cond.wait(None if due is None else max(0.0, due - self._clock()))
                now = self._clock()
                self._admitted(now)
                self._step_back(now)
                self._cond.notify(max(0, int(self._limit) - self._in_flight - 1))
            self._in_flight += 1
            self._filled = self._filled or self._in_flight >= int(self._limit)
            permit = Permit(self._generation, self._clock(), self._in_flight, self._served)
            if self._probe_out is None and self._plateau > self._limit \
                    and self._in_flight >= self._refused + self._margin():
                self._probe_out = permit  # under the plateau, past the lowest refused level
            return permit

    def renew(self, permit: Permit) -> Permit:
        """The permit to send the try with, just before it is sent: `permit`, unless a cut came
        since it was taken; then it is given back unsent and a new one waited for. A try whose
        thread took its permit before the service refused a call, and ran again only after the
        429 came back, would otherwise be sent into the service that refused it: twelve such
        tries were refused within 16 ms after one bench run's cut, their permits taken before it."""
        with self._cond:
            if permit.generation == self._generation:
                return permit
        self.release(permit, NOT_SENT)  # (while draining, the given-back call is not replaced)
        return self.acquire()

    def release(self, permit: Permit, outcome: str, retry_after_s: float | None = None) -> None:
        """The try of `permit` ended with `outcome` (an `ai_client.Try` outcome)."""
        with self._cond:
            now = self._clock()
            self._in_flight -= 1
            self._served += outcome == OK
            if permit is self._probe_out:
                self._probe_out = None
            if outcome == OVERLOAD:
                self._overloaded(permit, now, retry_after_s)
            elif outcome == OK:
                self._succeeded(now - permit.at, permit, now)
            self._admitted(now)
            self._step_back(now)
            self._drain(now)
            # Wake only as many waiters as may go on: waking every one of them on each release
            # (tens of workers of a stage wait here at the start of a burst) had them all
            # contend for this lock and the GIL just to wait again.
            self._cond.notify(max(0, int(self._limit) - self._in_flight))

    def _overloaded(self, permit: Permit, now: float, retry_after_s: float | None) -> None:
        self._refusals.append((permit.at, now))
        trip, ended = now - permit.at, self._served - permit.served
        self._trip = trip if not self._trip else self._trip + TRANSIT_WEIGHT * (trip - self._trip)
        self._transit = ended if self._transit is None else \
            self._transit + TRANSIT_WEIGHT * (ended - self._transit)
        margin = self._margin()
        if retry_after_s:
            self._hold_until = max(self._hold_until, now + retry_after_s)
        draining = self._drain_level is not None
        if draining:
            self._drain_level -= 1  # the refused call is not replaced either
        if permit.generation != self._generation:
            if draining and permit.level <= self._episode_held:
                # Refused at a level the service served: during a drain no call is sent to be
                # refused, so these are what tells a service that shrank.
                self._episode_refusals += 1
                if self._episode_refusals >= SHRINK_REFUSALS:
                    self._plateau = max(self._plateau, self._held, self._cut_level)
                    self._cut(math.floor(self._drain_level * self.backoff), now)
                    self._start_hold()
                    return
            # Sent before the last cut: the cut already answered it; one call fewer is held.
            self._set(min(self._limit, self._in_flight), now)
            if permit.at < self._cut_at + self._trip and now - self._cut_at < (self._min_latency or 0.0):
                # Sent before the episode's first 429 came back (blind, past the limit) or within a
                # round trip after it (its place at the service taken by one of those arriving
                # late): a call the episode's level counted but the service never held.
                self._cut_level -= 1
            return
        # An episode of refusals lasts one latency from its first, while they come at most
        # EPISODE_GAP latencies apart; `_cut_level` is what the service held when it began.
        previous = self._refusals[-2][1] if len(self._refusals) > 1 else -math.inf
        episode = (self._min_latency is not None and now - self._cut_at < self._min_latency
                   and now - previous < EPISODE_GAP * self._min_latency)
        # The calls the service would hold by now had the ones that ended been replaced.
        level = self._drain_level if draining else self._in_flight
        if not episode:
            self._cut_at, self._cut_level = now, min(self._limit, self._in_flight)
            # What the service held when it refused: what it served since the last cut, and the
            # calls in flight less those in transit. (The served level alone lags by a latency:
            # 50 with 60 in flight at a bench run's cut, so the refusals at 51 to 59 that told
            # it shrank did not count, and 15 were refused before the calls in flight fell by
            # a tenth.)
            self._episode_held = max(self._held, self._cut_level - margin)
            self._episode_refusals = 0
        if permit.level <= self._episode_held and self._plateau <= self._limit:
            self._episode_refusals += 1  # (under a plateau, refused probes at that level are expected)
        # Refused a tenth and the margin under a level the service served since the last cut, or,
        # within the episode, with a tenth and the margin fewer calls in flight than where it
        # began: the service shrank, not just our last probes were over (or counted a call on its
        # way). (The margin alone is not enough: calls that end together are replaced before the
        # service has counted them out, and a bench run's try refused at 31, 33 having been served
        # by a service that still held 32, halved the limit.)
        shrank = (permit.level + margin < SHRINK_SIGN * self._held
                  or (episode and level + margin < SHRINK_SIGN * self._cut_level)
                  or self._episode_refusals >= SHRINK_REFUSALS)
        self._refused = min(self._refused, permit.level) if episode else permit.level
        if shrank:
            self._plateau = max(self._plateau, self._held, self._cut_level)
        elif self._plateau > self._limit:
            # A probe under the plateau refused: the next waits a latency (or the Retry-After),
            # longer after every PROBE_PATIENCE refused ones, so a service that stays low
            # costs ever fewer 429s.
            self._probes += 1
            wait = max(retry_after_s or 0.0, self._min_latency or 0.0)
            self._hold_until = max(self._hold_until, now + wait * max(1.0, self._probes / PROBE_PATIENCE))
        if shrank:
            self._cut(math.floor(level * self.backoff), now)
        elif draining:
            self._set(min(self._limit, self._in_flight), now)
            self._drain_step = 1.0  # a step of the return refused: the next is one call again
        elif self._plateau <= self._limit and self._trip:
            # Until this refusal's round trip has passed again, the 429s of calls sent before it
            # came back are on their way: were the calls that end replaced meanwhile, a service
            # that shrank would refuse every replacement too (a dozen 429s in one bench run's
            # cut). So none is: the limit follows the calls in flight down, and comes back to
            # the level less the refused calls when nothing says the service shrank.
            self._cut(self._in_flight, now)
            self._drain_level, self._drain_until = float(self._in_flight), now + self._trip
            self._drain_step, self._step_at = 1.0, -math.inf
        elif self._in_flight < self._limit:
            self._cut(self._in_flight, now)
        self._start_hold()

    def _succeeded(self, latency: float, permit: Permit, now: float) -> None:
        self._min_latency = latency if self._min_latency is None else min(self._min_latency, latency)
        level = self._served_level(permit, now)
        if permit.generation == self._generation:
            self._held = max(self._held, level)
            # Rounds take only calls sent since the last cut: those sent before it queued behind
            # the calls it cut, and would cut again for a queue already answered (a bench run's
            # check stage: 64, 32, 16, 8 within a second, its service unchanged).
            self._round.append(latency)
        self._smooth(latency)
        if len(self._round) >= max(self._limit, MIN_ROUND):
            mean = sum(self._round) / len(self._round)
            self._round.clear()
            self._baseline = mean if self._baseline is None else min(self._baseline, mean)
            if mean > self.latency_tolerance * self._baseline:
                self._cut_at, self._cut_level = now, self._limit
                self._cut(self._limit * max(0.5, self._baseline / mean), now)
                self._start_hold()
                return
        if self._plateau > self._limit and permit.generation == self._generation \
                and level >= self._refused + self._margin():
            self._grew(level, now)
            return
        if 2 * (self._in_flight + 1) < self._limit:
            # Under half in use: this success says nothing about the limit. (Not "all in use":
            # replacements for calls that just ended are still on their way to `acquire`.)
            return
        if self._hold > 0 or now < self._hold_until:
            self._hold -= 1
            return
        if permit.generation != self._generation:
            return  # sent before the last cut: its success says nothing of the limit since
        if self._smoothed > GROWTH_TOLERANCE * self._smoothed_low:
            return  # calls queue, here or there: more in flight would wait, not finish sooner
        if not self._filled:
            return  # the last step is not taken yet: a step beyond it would run ahead of the calls
        # The 429 of the last step, if it went past the limit, may still be on its way; under the
        # lowest level refused, one is unlikely, and a round trip is enough (waiting for the
        # longest, a limit halved in error took 5 s, not 1.4, to climb back in a simulated run).
        wait = self._trip if self._trip and self._limit + 1 < self._refused else self._step_wait()
        if now - self._grown_at < wait or not self._growth_token(now):
            return
        grown = self._limit + min(1.0, self._rate)
        if self._plateau > self._limit:  # probes up to where a served one would say the service grew
            grown = min(grown, max(self._refused + self._margin(), self._limit))
        self._grown_at = now
        self._filled = False
        self._set(grown, now)
        self._round_left -= 1
        if self._round_left <= 0:
            self._rate = min(1.0, 4 * self._rate)
            self._round_left = self._limit / 2

    def _admitted(self, now: float) -> None:
        """The probe in flight has not been refused within a few 429 round trips: the service,
        which refuses a call as soon as it sees it, has admitted it, a latency before its answer
        would say so."""
        probe = self._probe_out
        if probe is None or now - probe.at < self._admit_wait():
            return
        self._probe_out = None
        level = self._served_level(probe, now)
        if self._plateau > self._limit and probe.generation == self._generation \
                and level >= self._refused + self._margin():
            self._grew(level, now)

    def _due(self) -> float | None:
        """When the probe out would be taken for admitted, or the return's next step is due."""
        times = [self._probe_out.at + self._admit_wait()] if self._probe_out else []
        times += [self._return_at] if self._returning is not None else []
        return min(times, default=None)

    def _admit_wait(self) -> float:
        """How long a try goes unrefused before it was admitted: until its refusal would be back,
        and at least ADMIT_SHARE of the latency."""
        return max(self._step_wait(), ADMIT_SHARE * (self._min_latency or 0.0))

    def _step_wait(self) -> float:
        """How long a step waits after the last: until the last one, had it gone past the
        service's limit, would have been refused. That is a few mean 429 round trips, and no less
        than the longest of the last two latencies: when the machine is loaded they spread widely
        (5 to 190 ms within a bench run's minute). Spaced by one mean round trip, probes under a
        plateau went three calls over the service's limit within 50 ms, all refused, the first
        70 ms on its way back; and a probe taken for admitted after 150 ms had its return step
        to 64 in 50 ms into a service that still held 32: 21 refused. Before any 429 there is
        no round trip to go by: BLIND_GAP then (a generate stage spent 8 saved tokens within
        30 ms of a wave, all refused 50 to 75 ms later)."""
        if not self._trip:
            return BLIND_GAP
        longest = max((refused - sent for sent, refused in self._refusals), default=0.0)
        return max(ADMIT_TRIPS * self._trip, longest)

    def _grew(self, level: int, now: float) -> None:
        """Sent since the last cut, the service took more calls than it last refused, by more
        than the calls in transit: it grew again. Back to where it was before it shrank, at most
        twice what it just took, in steps (`_step_back`)."""
        if self._returning is not None:
            return
        self._probes = 0
        self._returning = min(self._plateau, 2.0 * level)
        self._return_step, self._return_at = 1.0, -math.inf
        self._step_back(now)

    def _step_back(self, now: float) -> None:
        """The return `_grew` found, one call at first, the steps doubling each time a refusal of
        the last would be back (`_step_wait`): a probe served only because calls on their way back
        had freed its place at the service costs the first step's 429, not a return of tens of
        calls into a service that refuses them all (30 at once in a simulated run with 20 ms each
        way, give or take half). A refused step is a refused probe: the limit is cut to the calls
        in flight, and the cut ends the return."""
        if self._returning is None or now < self._return_at:
            return
        self._set(min(self._returning, self._limit + self._return_step), now)
        self._return_step, self._return_at = 2 * self._return_step, now + self._step_wait()
        if self._limit < self._returning:
            return
        self._returning = None
        if self._limit >= self._plateau:
            # Back where it was before it shrank: from here it grows as after any cut, after a
            # hold. (Growing on at once, as under the plateau, its saved tokens took a bench run's
            # limit from 64 to 70 within 100 ms of its return: 5 refused, taken for a shrink.)
            self._plateau, self._refused = 0.0, math.inf
            self._start_hold()
        else:  # doubled, not there yet: the next served try at the new limit doubles again
            self._refused = int(self._limit)

    def _drain(self, now: float) -> None:
        """While draining, a call that ends is not replaced; after it, back to the level in steps
        that double every 429 round trip, so that a service that shrank refuses the first step
        rather than every call that ended during the drain (13 refused at once in a bench run's
        cut, when the drain had seen two refusals, not the three that tell a shrink)."""
        if self._drain_level is None:
            return
        if now < self._drain_until:
            self._set(min(self._limit, self._in_flight), now)
            return
        if now < self._step_at:
            return
        self._set(min(self._drain_level, self._in_flight + self._drain_step), now)
        self._drain_step, self._step_at = 2 * self._drain_step, now + self._trip
        if self._limit >= self._drain_level:
            self._drain_level = None

    def _smooth(self, latency: float) -> None:
        """A running mean of the latency over about MIN_ROUND calls and its lowest: a rise says
        calls queue (at the service, or here for a CPU) before any round ends."""
        self._smoothed_n += 1
        weight = max(1.0 / self._smoothed_n, 1.0 / MIN_ROUND)
        previous = latency if self._smoothed is None else self._smoothed
        self._smoothed = previous + weight * (latency - previous)
        if self._smoothed_n >= MIN_ROUND:
            self._smoothed_low = min(self._smoothed_low, self._smoothed)

    def _margin(self) -> int:
        """Calls a level may count that the service does not hold: those in transit."""
        return max(1, math.ceil(self._transit or 0.0))

    def _served_level(self, permit: Permit, now: float) -> int:
        """The calls the service held with a served try: its level, less the tries in flight
        with it that were refused (the service never held those)."""
        horizon = now - 2 * (self._min_latency or 0.0)
        while self._refusals and self._refusals[0][1] < horizon:
            self._refusals.popleft()
        return permit.level - sum(sent <= permit.at < refused for sent, refused in self._refusals)

    def _growth_token(self, now: float) -> bool:
        """Growth is paced: tokens come one per latency / limit / 2, at most limit / GROWTH_BURST
        of them saved, so a wave of calls ending together grows the limit by a few calls, not
        by as many probes past the service's limit as the wave had calls. Until a 429 has
        measured the round trip a step's refusal takes, the limit doubles at most every
        BLIND_DOUBLING: paced by the latency only, a bench run's check stage (calls of 0.5 s)
        stepped every 4 ms at 64 and sent 16 tries past the service's limit before the first
        refusal, 150 ms on its way back, had come. (Tokens are still saved then: calls sent
        together end together, and without them a stage of 3 s calls grew by a few calls a
        wave, to 48 in 22 s where it had taken 13 s to 64.)"""
        latency = self._min_latency or 0.0
        pace = max(latency / 2, 0.0 if self._trip else BLIND_DOUBLING) / max(self._limit, 1.0)
        saved = max(1.0, self._limit / GROWTH_BURST)
        gained = (now - self._tokens_at) / pace if pace > 0 else saved
        self._tokens, self._tokens_at = min(saved, self._tokens + gained), now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _cut(self, value: float, now: float) -> None:
        """A lower limit; tries sent from now on are told apart from those sent before."""
        self._set(value, now)
        self._generation += 1
        self._held = 0
        self._drain_level = self._returning = None

    def _start_hold(self) -> None:
        self._round_left = self._limit / 2
        if self._plateau > self._limit:
            # Under the level the service held before it shrank: probe again as soon as its
            # Retry-After allows, so its return is found within a few latencies.
            self._hold, self._rate = 0.0, 1.0
            return
        self._hold = self.hold_rounds * self._limit
        self._rate = 1.0 / max(self._limit, 1.0)

    def _set(self, value: float, now: float) -> None:
        self._limit = min(float(self.maximum), max(float(self.minimum), value))
        self._note(now)

    def _note(self, now: float | None = None) -> None:
        at = self._clock() if now is None else now
        if int(self._limit) != self._noted:
            self._noted = int(self._limit)
            self.changes.append((at, self._limit, self._in_flight))
