"""A fleet's hold on a quota: its demand read off its gates, its grant applied, the lease kept."""

from __future__ import annotations

import threading

import psycopg2
import pytest

from consumers.ai.limit import NOT_SENT, AdaptiveLimit
from consumers.ai.rate_budget import RateBudget
from consumers.quota.holder import QuotaHolder
from consumers.quota.leases import CALLS, REQUESTS, Holder, Limits
from tests.hand_clock import HandClock

WHO = Holder("q", "h1", "p", "stage", "run", "standard", 1.0, lease_s=3.0, drain_s=10.0)



class Store:
    """Grants what it is told to, or fails like a database that went away."""

    def __init__(self) -> None:
        self.grant: dict[str, float] = {}
        self.down = False
        self.renewals: list[tuple[Limits, dict[str, float], int]] = []

    def renew(self, who, limits, demand, in_use, reserves=None):
        if self.down:
            raise psycopg2.OperationalError("connection refused")
        self.renewals.append((limits, demand, in_use))
        return dict(self.grant)


def fixed(clock: HandClock) -> AdaptiveLimit:
    """48 calls at once, on the clock the lease's end is read on."""
    return AdaptiveLimit(initial=48, minimum=48, maximum=48, clock=clock)


def holder(store: Store, clock: HandClock, limiter: AdaptiveLimit, budget: RateBudget | None = None,
           declared: Limits | None = None) -> QuotaHolder:
    return QuotaHolder(store, WHO, declared or Limits(calls=64), pool=48,  # type: ignore[arg-type]
                       limiter=limiter, budget=budget, clock=clock)


def test_nothing_is_called_before_the_first_renewal() -> None:
    limiter = fixed(HandClock(100.0))
    holder(Store(), HandClock(100.0), limiter)
    assert limiter.spare() == 0


def test_the_grant_caps_the_limit_until_the_lease_ends() -> None:
    clock, store = HandClock(100.0), Store()
    limiter = fixed(clock)
    quota = holder(store, clock, limiter)
    store.grant = {CALLS: 20}
    quota.tick()
    assert limiter.limit == 20
    clock.now += 2.9
    assert limiter.limit == 20
    clock.now += 0.2  # 3.1 s after the renewal began: the quota may give the share away now
    assert limiter.limit == 0


def test_a_failed_renewal_keeps_the_grant_within_the_lease_and_drops_the_budgets_after() -> None:
    clock, store = HandClock(100.0), Store()
    limiter = fixed(clock)
    budget = RateBudget(clock=clock)
    quota = holder(store, clock, limiter, budget, Limits(calls=64, requests=600))
    store.grant = {CALLS: 20, REQUESTS: 300}
    quota.tick()
    store.down = True
    clock.now += 1.0
    quota.tick()  # within the lease: nothing changes
    assert limiter.limit == 20
    clock.now += 2.5
    quota.tick()  # 3.5 s since the last renewal began
    assert limiter.limit == 0
    assert budget.try_take(1)[1] is None


def test_waiting_callers_ask_for_the_whole_pool_and_idle_ones_for_what_they_use() -> None:
    clock, store = HandClock(100.0), Store()
    limiter = fixed(clock)
    quota = holder(store, clock, limiter)
    store.grant = {CALLS: 8}
    quota.tick()
    permits = [limiter.acquire() for _ in range(8)]
    quota.tick()
    # 8 out, nobody waiting: 8 and a quarter more, 10.
    assert store.renewals[-1][1] == {CALLS: 10.0} and store.renewals[-1][2] == 8
    waiter = threading.Thread(target=lambda: limiter.release(limiter.acquire(), NOT_SENT))
    waiter.start()
    while limiter.waiters() != (1, 1):
        threading.Event().wait(0.001)
    quota.tick()
    assert store.renewals[-1][1] == {CALLS: 48.0}
    limiter.release(permits.pop(), NOT_SENT)
    waiter.join(timeout=5)
    assert not waiter.is_alive()


def test_the_request_rate_asked_for_is_the_rate_in_use_with_headroom() -> None:
    clock, store = HandClock(100.0), Store()
    limiter = fixed(clock)
    budget = RateBudget(requests_per_minute=1200, clock=clock)
    quota = holder(store, clock, limiter, budget, Limits(calls=64, requests=1200))
    store.grant = {CALLS: 48, REQUESTS: 1200}
    quota.tick()
    for _ in range(10):  # 10 requests in 2 s: 300 a minute
        clock.now += 0.2
        assert budget.try_take(1)[1] is not None
    quota.tick()
    # 300 a minute and a quarter more, plus one call's request: 376.
    assert store.renewals[-1][1][REQUESTS] == pytest.approx(376.0)


def test_announced_limits_lower_the_declared_ones() -> None:
    clock, store = HandClock(100.0), Store()
    limiter = fixed(clock)
    budget = RateBudget(clock=clock)
    _, spent = budget.try_take(1)
    assert spent is not None
    budget.observe({"x-ratelimit-limit-requests": "900", "x-ratelimit-remaining-requests": "850",
                    "x-ratelimit-reset-requests": "2s"}, spent)
    quota = holder(store, clock, limiter, budget, Limits(calls=64, requests=1200))
    assert quota.limits() == Limits(calls=64, requests=900.0, tokens=None)


def test_a_share_of_a_budget_the_endpoint_never_announced_refills_at_the_share() -> None:
    # 120 requests a minute granted, nothing known of the endpoint's own budget: empty at first,
    # then one request every 0.5 s.
    clock, store = HandClock(100.0), Store()
    budget = RateBudget(clock=clock)
    quota = holder(store, clock, fixed(clock), budget, Limits(requests=600))
    store.grant = {REQUESTS: 120}
    quota.tick()
    assert budget.try_take(1)[1] is None
    clock.now += 0.5
    assert budget.try_take(1)[1] is not None
    assert budget.try_take(1)[1] is None


def test_calls_asked_for_follow_the_most_out_in_the_last_five_seconds() -> None:
    clock, store = HandClock(100.0), Store()
    limiter = fixed(clock)
    quota = holder(store, clock, limiter)
    store.grant = {CALLS: 16}
    quota.tick()
    permits = [limiter.acquire() for _ in range(12)]
    quota.tick()  # 12 out: 12 and a quarter, 15
    for permit in permits[2:]:
        limiter.release(permit, NOT_SENT)
    clock.now += 4.5
    quota.tick()  # 2 out, 12 out 4.5 s ago: still 15
    assert [demand[CALLS] for _, demand, _ in store.renewals[-2:]] == [15.0, 15.0]
    clock.now += 1.0
    quota.tick()  # 12 out 5.5 s ago, forgotten: 2 and one more, 3
    assert store.renewals[-1][1][CALLS] == 3.0
