"""The permits callers take: how many tries are in flight at once against one endpoint, under
the limit `LearnedLimit` learns from the samples they pass on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from consumers.ai.limit.algorithm import LearnedLimit
from consumers.ai.limit.flight import NOT_SENT, OK, OVERLOAD, Flight, Permit
from consumers.ai.limit.log import LimitWatcher
from consumers.ai.limit.settings import LimitSettings
from consumers.ai.waits import Cancelled


class AdaptiveLimit:
    """An in-flight limit for one endpoint; thread-safe, `acquire` blocks while it is reached.
    The algorithm and its `watchers` (a `log.ChangeLog`) run under the permits' lock: a sample
    and the count it was taken at never drift apart."""

    def __init__(self, initial: int = 20, minimum: int = 1, maximum: int = 1024,
                 clock: Callable[[], float] = time.monotonic, settings: LimitSettings | None = None,
                 watchers: Iterable[LimitWatcher] = ()) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._flight = Flight()
        self._generation = 0  # cuts so far: a try sent before the latest is told apart
        self._waiting = 0  # callers in `acquire`
        self._parked = 0  # ... of them waiting on the condition
        self._share: int | None = None  # the calls at once a shared quota grants (None: no quota)
        self._share_until = float("inf")  # ... until its lease ends: then none
        self._algorithm = LearnedLimit(initial, minimum, maximum, settings or LimitSettings(),
                                       self._flight, clock(), watchers=watchers)

    @classmethod
    def fixed(cls, limit: int) -> AdaptiveLimit:
        """A limit that never moves (a published concurrency), shared the same way."""
        return cls(initial=limit, minimum=limit, maximum=limit)

    @property
    def limit(self) -> int:
        """The calls allowed at once: the learned limit, within a quota's share."""
        with self._cond:
            return self._allowed()

    def _allowed(self) -> int:
        learned = int(self._algorithm.limit)
        if self._share is None:
            return learned
        return min(learned, self._share) if self._clock() < self._share_until else 0

    def share(self, calls: int | None, until: float = float("inf")) -> None:
        """The calls at once a quota shared with other fleets grants this one (None: none
        binds) until `until` (a reading of `clock`: the lease's end, after which the quota may
        give the share to others): a cap on the learned limit, which goes on learning under it."""
        with self._cond:
            self._share, self._share_until = calls, until
            self._cond.notify(max(0, self._allowed() - self._flight.held))

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._flight.held

    def waiters(self) -> tuple[int, int]:
        """Callers in `acquire`, and how many of them wait on the condition (the others are on
        their way in or out): a test frees a permit once they all wait."""
        with self._cond:
            return self._waiting, self._parked

    def spare(self) -> int:
        """Permits free now: what a caller may start without waiting."""
        with self._cond:
            self._algorithm.tick(self._clock(), wanted=True)
            return max(0, self._allowed() - self._flight.held)

    def acquire(self, cancel: threading.Event | None = None) -> Permit:
        """A permit, once the limit has room; `Cancelled` once `cancel` is set (`wake`)."""
        with self._cond:
            algorithm = self._algorithm
            self._waiting += 1
            try:
                algorithm.tick(self._clock(), wanted=True)
                while self._flight.held >= self._allowed():
                    if cancel is not None and cancel.is_set():
                        raise Cancelled
                    due = algorithm.due(self._clock())
                    self._parked += 1
                    try:
                        self._cond.wait(None if due is None else max(0.001, due - self._clock()))
                    finally:
                        self._parked -= 1
                    algorithm.tick(self._clock(), wanted=True)
            finally:
                self._waiting -= 1
            self._flight.held += 1
            return Permit(self._generation, self._clock(), held=self._flight.held)

    def wake(self) -> None:
        """Wake every caller waiting in `acquire`, to look at its `cancel` again."""
        with self._cond:
            self._cond.notify_all()

    def renew(self, permit: Permit, cancel: threading.Event | None = None) -> Permit:
        """The permit to hold for the try once its thread runs: `permit`, unless a cut came since
        it was taken (its thread may have waited to run meanwhile); then it is given back unsent
        and a new one waited for, so no try goes into a service that just refused one."""
        with self._cond:
            if permit.generation == self._generation:
                return permit
        self.release(permit, NOT_SENT)
        return self.acquire(cancel)

    def sent(self, permit: Permit) -> Permit:
        """`permit`'s try goes out now: counted at the endpoint from here, at the level of the
        calls sent with it (the algorithm may mark it as past a step)."""
        with self._cond:
            self._flight.sent += 1
            return self._algorithm.sent(Permit(permit.generation, self._clock(), permit.held,
                                               self._flight.sent, sent=True))

    def release(self, permit: Permit, outcome: str, retry_after_s: float | None = None) -> None:
        """The try of `permit` ended with `outcome` (an `ai_client.Try` outcome; OVERLOAD only
        for a concurrency refusal)."""
        with self._cond:
            now, flight, algorithm = self._clock(), self._flight, self._algorithm
            flight.held -= 1
            flight.sent -= permit.sent
            flight.ended_at, flight.ended = now, flight.ended + 1
            cut, stale = False, permit.generation != self._generation
            if outcome == OVERLOAD:
                cut = algorithm.refused(permit, now, retry_after_s, stale)
            elif outcome == OK:
                cut = algorithm.served(permit, now)
            self._generation += cut
            algorithm.tick(now, wanted=self._waiting > 0)
            # Wake only as many waiters as may go on, not every worker of a stage.
            self._cond.notify(max(0, self._allowed() - flight.held))
