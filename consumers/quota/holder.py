"""A fleet's hold on a quota: its demand renewed every tick, its grant applied to its client.

The demand is read off the fleet's own gates. Callers waiting for a permit, or for a minute's
budget, mean the fleet's records are waiting for calls: it asks for all its pool can take (or
the whole budget). Otherwise it asks for what it uses, with headroom to grow, so an idle
pipeline's share goes to the backlogged ones on the next renewals and comes back as soon as
its callers wait again. Calls at once are asked for by the most out in the last seconds, so
a steady load's bursts find their share already there. The grant caps the concurrency limit
until the lease's end, so a fleet that cannot renew (the database is gone) stops starting
calls before the others may take its share; its per-minute budgets fall to nothing at the
first failed renewal past the lease.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

import psycopg2

from consumers.ai.limit import AdaptiveLimit
from consumers.ai.rate_budget import REQUESTS as BUDGET_REQUESTS
from consumers.ai.rate_budget import TOKENS as BUDGET_TOKENS
from consumers.ai.rate_budget import RateBudget
from consumers.quota.leases import CALLS, REQUESTS, TOKENS, Holder, LeaseStore, Limits

log = logging.getLogger(__name__)

TICK_S = 0.5  # how often a holder renews: a share moves within a few of them
LEASE_S = 3.0  # how long a renewal holds: a few ticks missed before the share is lost
HEADROOM = 0.25  # of the calls or the rate in use, asked for beyond it so a share can grow
RATE_WINDOW_S = 5.0  # the rate in use is read over this much of the recent past
PEAK_WINDOW_S = 5.0  # ... and the most calls out at once (an idle fleet's share goes after it)
_BUDGET_KIND = {REQUESTS: BUDGET_REQUESTS, TOKENS: BUDGET_TOKENS}


class QuotaHolder:
    """Renews one fleet's claim on a quota and applies the grant to its limiter and budget."""

    def __init__(self, store: LeaseStore, who: Holder, declared: Limits, pool: int,
                 limiter: AdaptiveLimit, budget: RateBudget | None,
                 reserves: Mapping[str, float] | None = None, minute_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.who, self.declared, self.pool = store, who, declared, pool
        self.limiter, self.budget, self.reserves = limiter, budget, reserves
        self._minute_s = minute_s
        self._clock = clock
        self._renewed_at = -math.inf
        self._taken: deque[tuple[float, dict[str, float]]] = deque()
        self._in_use: deque[tuple[float, int]] = deque()
        self.grant: dict[str, float] = {d: 0.0 for d in (CALLS, REQUESTS, TOKENS)
                                        if declared.of(d) is not None}
        self._apply(self.grant, until=math.inf)  # nothing until the first renewal

    def limits(self) -> Limits:
        """The declared limits, lowered to what the endpoint's answers announce (they count
        every caller's spending on the same account)."""
        announced = self.budget.announced if self.budget is not None else {}
        return Limits(self.declared.calls, *(
            _lower(self.declared.of(d), announced.get(_BUDGET_KIND[d])) for d in (REQUESTS, TOKENS)))

    def demand(self, now: float, limits: Limits) -> tuple[dict[str, float], int]:
        """What the fleet asks for of each dimension, and the calls it has out. Without
        callers waiting, the calls asked for follow the most it had out over the last
        PEAK_WINDOW_S, so a share covers the bursts of a steady load, not only its mean."""
        in_use = self.limiter.in_flight
        waiting, _ = self.limiter.waiters()
        self._in_use.append((now, in_use))
        while now - self._in_use[0][0] > PEAK_WINDOW_S:
            self._in_use.popleft()
        peak = max(n for _, n in self._in_use)
        calls = self.pool if waiting else min(self.pool, peak + max(1, math.ceil(peak * HEADROOM)))
        demand = {CALLS: float(calls)}
        if self.budget is not None:
            budget_waiting, taken = self.budget.usage()
            self._taken.append((now, taken))
            while len(self._taken) > 2 and now - self._taken[1][0] >= RATE_WINDOW_S:
                self._taken.popleft()
            (since, first), = self._taken[0],
            span = now - since
            for dimension in (REQUESTS, TOKENS):
                capacity = limits.of(dimension)
                if capacity is None:
                    continue
                kind = _BUDGET_KIND[dimension]
                per_minute = (taken[kind] - first[kind]) * self._minute_s / span if span > 0 else 0.0
                one_call = taken[kind] / max(1.0, taken[BUDGET_REQUESTS])
                demand[dimension] = capacity if budget_waiting else per_minute * (1 + HEADROOM) + one_call
        return demand, in_use

    def tick(self) -> None:
        """One renewal; on failure, the grant holds until the lease's end and none after."""
        started = self._clock()
        limits = self.limits()
        demand, in_use = self.demand(started, limits)
        try:
            self.grant = self.store.renew(self.who, limits, demand, in_use, self.reserves)
        except (psycopg2.Error, OSError) as exc:
            log.warning("quota %s not renewed: %s", self.who.quota, exc)
            if started - self._renewed_at > self.who.lease_s:
                self._apply(dict.fromkeys(self.grant, 0.0), until=math.inf)
            return
        self._renewed_at = started
        self._apply(self.grant, until=started + self.who.lease_s)

    def _apply(self, grant: Mapping[str, float], until: float) -> None:
        if CALLS in grant:
            self.limiter.share(int(grant[CALLS]), until=until)
        if self.budget is not None:
            for dimension in (REQUESTS, TOKENS):
                if dimension in grant:
                    self.budget.share(_BUDGET_KIND[dimension], grant[dimension])

    def run(self, stop: threading.Event, tick_s: float = TICK_S) -> None:
        """Renew every tick until `stop`; the fleet releases the claim once its calls are done."""
        while not stop.wait(tick_s):
            self.tick()

    def release(self) -> None:
        try:
            self.store.release(self.who)
        except (psycopg2.Error, OSError) as exc:
            log.warning("quota %s not released (its lease lapses instead): %s", self.who.quota, exc)
        self.store.close()


def _lower(declared: float | None, announced: float | None) -> float | None:
    if declared is None:
        return announced
    return declared if announced is None else min(declared, announced)
