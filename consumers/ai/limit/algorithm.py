"""The limit learned from the calls' ends: one entry point per sample (a call sent, served or
refused, and time moving on), the rest its own. How it probes, shrinks and backs off, and why:
docs/adaptive.md."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace

from consumers.ai.limit.flight import Flight, Permit
from consumers.ai.limit.log import LimitWatcher
from consumers.ai.limit.measurement import Latencies, RoundTrips
from consumers.ai.limit.settings import LimitSettings


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


class LearnedLimit:
    """The limit of one endpoint, learned from the samples the permits pass on under their
    lock (a sample that cuts it says so, for the permits to tell the tries sent before apart);
    reads their counts (`flight`), tells `watchers` of each change of its whole number."""

    def __init__(self, initial: int, minimum: int, maximum: int, settings: LimitSettings,
                 flight: Flight, now: float, watchers: Iterable[LimitWatcher] = ()) -> None:
        self.minimum, self.maximum = minimum, maximum
        self.settings = settings
        self.limit = float(initial)
        self._flight = flight
        self._watchers = tuple(watchers)
        self._noted = -1  # the limit the watchers were last told
        self._plateau = 0  # the highest level a served call was sent at
        self._refused_level = math.inf  # the level of the last probe refused
        self._growing = False  # a call was served there since: the service grew
        # (sent, level) of the served calls of the latest median
        self._answered: deque[tuple[float, int]] = deque(maxlen=settings.median_of)
        self._latencies = Latencies(settings)
        self._trips = RoundTrips(settings)
        self._probing = _Probing(floor=initial)
        self._episode = _Episode()
        self._set(self.limit, now)

    # -- the samples

    def sent(self, permit: Permit) -> Permit:
        """`permit`'s call went out at its level. The first sent past the step's level is its
        probe, and a refusal of any call sent past it is the step's: a permit taken past it may
        go out at a lower level (others held, their records being written), and its silence
        would say nothing of the level probed, its refusal nothing of the step."""
        probing = self._probing
        if probing.taken_from is None or permit.level <= probing.taken_from:
            return permit
        stepped = replace(permit, stepped=True)
        if probing.first is None:
            probing.first, probing.probed_at = stepped, stepped.at
        return stepped

    def served(self, permit: Permit, now: float) -> bool:
        """A served call: its latency, its level (with the calls still in flight: one sent first
        in a burst has a level of 1), a probe admitted, a queue seen in the window medians (a
        cut: True)."""
        window_closed = self._latencies.add(now - permit.at)
        self._answered.append((permit.at, max(permit.level, self._flight.sent + 1)))
        self._plateau = max(self._plateau, permit.level)
        self._growing = self._growing or permit.level >= self._refused_level
        if permit is self._probing.first:
            self._admitted(now)
        if window_closed and self._latencies.queued(self.settings.latency_tolerance):
            self._cut(self.settings.backoff * self.limit, now)
            self._probing.next_at = now + self._latency()
            return True
        return False

    def refused(self, permit: Permit, now: float, retry_after_s: float | None, stale: bool) -> bool:
        """A concurrency refusal of `permit`'s call (`retry_after_s`: its Retry-After; `stale`:
        sent before the latest cut); True when it cuts the limit."""
        self._trips.add(now - permit.at)
        if stale:
            # Sent before the latest cut, which answered it already; but a refused call freed
            # no place at the service, so its permit goes to no other call. Far under what the
            # service answered, it says the service shrank as much as a call sent after.
            self._set(min(self.limit, float(self._flight.sent)), now)
            self._probing.floor = min(self._probing.floor, int(self.limit))
            if self._shrank(permit, now, opens=False):
                self._halve(now)
                return True
            return False
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
        return True

    def tick(self, now: float, wanted: bool) -> None:
        """What time alone decides: a probe out unrefused long enough, the next step when
        callers want one."""
        if self._probe_held(now):
            self._admitted(now)
        if wanted and self._may_step(now):
            self._probing.taken_from = int(self.limit)
            self._set(self.limit + max(1.0, self._probing.step), now)

    def due(self, now: float) -> float | None:
        """When time alone may let a waiting caller go on."""
        probing = self._probing
        if probing.first is not None:
            return probing.first.at + self._admit_wait()
        if probing.taken_from is None:
            if probing.next_at > now:
                return probing.next_at
            if self._flight.ended < probing.next_after and now < probing.latest < math.inf:
                return probing.latest  # else a call's end wakes the waiters
        return None

    # -- what a refusal teaches

    def _probe_refused(self, now: float, retry_after_s: float | None, untried: bool) -> None:
        """A probe's step went past what the service holds: back to the level settled on (the
        step's other calls are stale by then), and the next probe waits twice longer than after
        the last refused one: up to `probe_every` latencies under the level to regain (less the
        calls in transit, which it counted), where a service that shrank comes back within
        seconds; up to `ceiling_every` rounds with nothing to regain, where each probe that finds
        no growth costs a 429. Back more than
        halfway to the level to regain, nothing is left to regain (it may be a level counted with
        answers in transit, never held); a refused step of more than one call (`untried`) leaves
        the levels under its top to probe soon (docs/adaptive.md says why)."""
        s = self.settings
        self._cut(self._probing.floor, now)
        probing = self._probing
        if probing.regain and 2 * probing.floor > probing.halved + probing.regain:
            probing.regain = 0  # and the next probe waits no less than at a first refusal there
            probing.refused_wait = max(probing.refused_wait, s.ceiling_first_wait / 2)
        if untried:
            probing.next_at = now + max(retry_after_s or 0.0, s.first_probe_wait * self._latency())
        elif probing.floor + self._in_transit() >= probing.regain:  # at the ceiling
            probing.refused_wait = min(s.ceiling_every, 2 * probing.refused_wait or s.ceiling_first_wait)
            self._wait(now, retry_after_s or 0.0, rounds=probing.refused_wait, longest=s.ceiling_every_s)
        else:
            probing.refused_wait = min(s.probe_every, 2 * probing.refused_wait or s.first_probe_wait)
            longest = max(s.probe_every_s, s.lasted_share * (now - probing.shrank_at))
            wait = min(probing.refused_wait * self._latency(), longest)
            probing.next_at = now + max(retry_after_s or 0.0, wait)

    def _wait(self, now: float, seconds: float, rounds: float, longest: float) -> None:
        """The next step no sooner than `seconds` from now, nor before `rounds` of the limit's
        calls have ended (a refused probe's 429 is then that share of the calls whatever the
        latencies' tail), unless `longest` has passed."""
        probing = self._probing
        probing.next_at, probing.latest = now + seconds, now + longest
        probing.next_after = self._flight.ended + math.ceil(rounds * self.limit)

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
        self._cut(self._flight.sent, now)
        wait = max(self._probing.refused_wait, self.settings.first_probe_wait) * self._latency()
        self._probing.next_at = now + max(retry_after_s or 0.0, min(wait, self.settings.probe_every_s))

    def _halve(self, now: float) -> None:
        """The service shrank: half the level it held (the level answered, less the calls in
        transit), probed from at once, and the level answered to regain."""
        self._probing.regain, self._probing.shrank_at = self._episode.level, now
        self._cut(self.settings.backoff * (self._episode.level - self._in_transit() + 1), now)
        self._probing.halved = int(self.limit)
        self._episode.began, self._probing.next_at, self._probing.refused_wait = -math.inf, now, 0.0

    def _shrank(self, permit: Permit, now: float, opens: bool) -> bool:
        """Count the refusal into its episode: the service shrank when, within a latency of the
        episode's first, `shrink_refusals` more came further under the highest level it had
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
        return episode.under >= self.settings.shrink_refusals

    def _answered_level(self, now: float, latency: float) -> int:
        """The highest level the service answered among the calls sent in the last two
        latencies (the level settled on when none was)."""
        return max((level for at, level in self._answered if at >= now - 2 * latency),
                   default=self._probing.floor)

    # -- what an admission teaches

    def _admitted(self, now: float) -> None:
        """The probe step was taken by the service: the next one at once, twice as large, but
        landing on the level to regain, or else on the highest level served, and past that, once
        the service has refused a call, one call at a time: a step of eight past what the
        service holds is eight 429s."""
        probing = self._probing
        mark = probing.regain if probing.floor < probing.regain else self._plateau
        probing.floor = int(self.limit)
        probing.taken_from, probing.first = None, None
        largest = max(1.0, self.settings.step_share * self.limit)
        if self._trips.mean is None:
            largest = min(largest, self.settings.first_step)
        probing.step = min(2 * probing.step, largest)
        if self.limit < mark:
            probing.step = min(probing.step, mark - self.limit)
        elif self._trips.mean is not None and not self._growing:
            probing.step = 1.0
        probing.next_at, probing.next_after, probing.latest = now, 0, math.inf

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
                and (self._flight.ended >= probing.next_after or now >= probing.latest)
                and bool(self._latencies.recent) and self._flight.held >= int(self.limit)
                and (self.limit < self._probing.regain or not self._latencies.slowed()))

    # -- the measures waits are made of

    def _stalled(self, now: float) -> bool:
        """No call has ended for `stall_ends` calls' share of the latency: this process or the
        service is held up (a loaded machine), and a probe's refusal may be on its way however
        long it has been out."""
        gap = self.settings.stall_ends * self._latency() / max(self._flight.held, 1)
        return now - self._flight.ended_at > max(gap, self._admit_wait())

    def _in_transit(self) -> int:
        """Calls a level may count that the service does not hold: those answered and on their
        way back (the limit's calls end limit / latency a second, each a 429 round trip on its
        way; twice that, as round trips spread), and one."""
        latency = self._latency()
        if not latency:
            return 1
        return 1 + math.ceil(self.settings.transit_spread * self.limit * (self._trips.mean or 0.0) / latency)

    def _latency(self) -> float:
        """The median latency of the recent calls: the time unit of waits."""
        return self._latencies.median()

    def _admit_wait(self) -> float:
        """How long a probe goes unrefused before it was admitted: a few 429 round trips, and
        no less than the longest of the recent ones (on a loaded machine a refusal waits for a
        CPU here as long as it took to come), or a share of the latency until one has been
        measured, and no less than `first_trip_s` (its round trip unknown, the climb is blind: a
        refusal that comes back late finds the limit that many steps past the service)."""
        s = self.settings
        if self._trips.mean is not None:
            return max(s.admit_trips * self._trips.mean, self._trips.longest())
        return max(s.admit_share * self._latency(), s.first_trip_s) if self._latencies.recent else math.inf

    def _cut(self, value: float, now: float) -> None:
        """A lower limit (the sample returns True: tries sent from now on are told apart)."""
        self._set(value, now)
        self._growing = False
        self._probing.settle(int(self.limit))

    def _set(self, value: float, now: float) -> None:
        self.limit = min(float(self.maximum), max(float(self.minimum), value))
        if int(self.limit) != self._noted:
            self._noted = int(self.limit)
            for watcher in self._watchers:
                watcher.changed(now, self.limit, self._flight.held)
