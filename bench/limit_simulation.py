"""A service refusing past a concurrency limit that follows a schedule, simulated event by event,
and the adaptive limit (`consumers.ai.limit.AdaptiveLimit`) feeding it from a caller
with unlimited work: what tests/unit/test_concurrency_limit.py checks the limiter against, and
what bench/limit_matrix.py runs over shapes it was not tuned on. Latency draws, the simulation
and the figures counted at the service."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from typing import Any

from consumers.ai.limit import NOT_SENT, OK, OVERLOAD, AdaptiveLimit, Permit
from consumers.ai.rate_budget import REQUESTS, RateBudget, Spent
from consumers.config.pipeline_spec.endpoints import Z99

Draw = Callable[[random.Random], float]
Schedule = list[tuple[float, int]]  # (from when, the service's limit), the first at 0
Stalls = tuple[tuple[float, float], ...]


class Clock:
    """A clock the simulation (or a test) sets: the limiter reads time only from it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- latency draws

def fixed(mean: float) -> Draw:
    """About `mean`, within 10 %: calls that take the same time, not in lockstep."""
    return lambda rng: mean * rng.uniform(0.9, 1.1)


def lognormal(median: float, p99: float) -> Draw:
    """Lognormal, given as model APIs' latencies are quoted: a median and a p99."""
    sigma = math.log(p99 / median) / Z99
    return lambda rng: rng.lognormvariate(math.log(median), sigma)


def pareto(median: float, alpha: float) -> Draw:
    """Pareto with the given median: P(X > x) = (x_m / x)^alpha; alpha 2 has no variance."""
    scale = median / 2 ** (1 / alpha)
    return lambda rng: scale * rng.paretovariate(alpha)


def bimodal(median: float, slow_share: float, factor: float) -> Draw:
    """Most calls about `median`, `slow_share` of them `factor` times as long (a long answer, a
    cold cache): a tail with nothing between, which a window's median does not see."""
    fast, slow = fixed(median), fixed(factor * median)
    return lambda rng: slow(rng) if rng.random() < slow_share else fast(rng)


# -- the simulated service

def limit_at(schedule: Schedule, t: float) -> int:
    """The service's limit at `t`: the last change at or before it."""
    return [lim for at, lim in schedule if t >= at][-1]


def adaptive(clock: Callable[[], float]) -> AdaptiveLimit:
    """The limiter as a fleet's AI client makes it, told nothing."""
    return AdaptiveLimit(clock=clock)


def simulate(schedule: Schedule, until: float, draw: Draw, lag: float = 0.005,
             jitter: float = 0.5, retry_after: float | None = None, seed: int = 7,
             per_minute: int | None = None, budget_retry_after: bool = True,
             stalls: Stalls = (),
             limiter: Callable[[Callable[[], float]], AdaptiveLimit] = adaptive) -> dict[str, Any]:
    """A service refusing past its concurrency limit (which follows `schedule`) as soon as a
    call reaches it and serving the others in a latency drawn by `draw`, fed by a caller with
    unlimited work through the limiter (`limiter`, made on the simulation's clock); returns what
    happened (`done`: when the caller got each answer, `refused_at`: when the service refused
    each call, `busy`: the (start, end) of each served call at the service).

    `lag` is each way between the caller and the service (+-`jitter` of it, drawn per trip): a
    call acquired at t reaches the service at t + lag; a call the service ends at t frees its
    place there at t but is released by the caller at t + lag, so the caller's count of calls
    in flight includes those on their way, as a real client's does. A 429 carries `retry_after`
    (None: no Retry-After).

    With `per_minute`, the service also meters requests per minute as a continuously refilled
    bucket, checked first: a call past it is refused as a spent budget (with a Retry-After
    until the next request unless not `budget_retry_after`), and every answer announces the
    budget in OpenAI's headers. The caller spends a `RateBudget` learned from those before
    each call, as the AI client does, and tells it of budget refusals instead of the limit.

    `stalls` are spans in which the caller's process does not run (a loaded machine): it sends
    nothing, and what the service answers meanwhile reaches it in the first 20 ms after the
    span ends, while the service goes on."""
    rng, trips = random.Random(seed), random.Random(seed + 4)
    clock = Clock()
    limit = limiter(clock)
    budget = RateBudget(clock=clock)
    bucket = {"level": float(per_minute or 0), "at": 0.0}

    def announced(t: float) -> dict[str, str]:
        if not per_minute:
            return {}
        bucket["level"] = min(per_minute, bucket["level"] + (t - bucket["at"]) * per_minute / 60)
        bucket["at"] = t
        return {"x-ratelimit-limit-requests": str(per_minute),
                "x-ratelimit-remaining-requests": str(int(bucket["level"])),
                "x-ratelimit-reset-requests": f"{(per_minute - bucket['level']) * 60 / per_minute:.3f}s"}
    events: list[tuple[float, int, str, Any, Any]] = []
    taken: dict[int, Spent] = {}  # each call's share of the budget, until it is back
    state: dict[str, Any] = {"serving": 0, "calls": 0, "refused": 0, "spent": 0, "done": [],
                             "refused_at": [], "busy": [], "wake": -math.inf}

    def trip() -> float:
        return lag * trips.uniform(1 - jitter, 1 + jitter)

    def arrive(t: float, call: int, permit: Permit) -> None:
        headers = announced(t)
        if per_minute and bucket["level"] < 1:
            state["refused"] += 1
            state["spent"] += 1
            wait = (1 - bucket["level"]) * 60 / per_minute if budget_retry_after else None
            heapq.heappush(events, (t + 0.001 + trip(), call, "spent", permit, (wait, headers)))
            return
        if state["serving"] >= limit_at(schedule, t):
            state["refused"] += 1
            state["refused_at"].append(t)
            heapq.heappush(events, (t + 0.001 + trip(), call, "refused", permit, False))
            return
        state["serving"] += 1
        if per_minute:
            bucket["level"] -= 1
        end = t + draw(rng)
        state["busy"].append((t, end))
        heapq.heappush(events, (end, call, "free", permit, True))
        heapq.heappush(events, (end + trip(), call, "answer", permit, True))

    def send(t: float) -> None:
        while limit.spare():
            wait, spent = budget.try_take(0)
            if spent is None:
                if state["wake"] <= t:  # one wake-up pending at a time
                    state["wake"] = t + wait
                    heapq.heappush(events, (t + wait, 0, "wake", None, None))
                return
            permit = limit.sent(limit.acquire())
            state["calls"] += 1
            taken[state["calls"]] = spent
            heapq.heappush(events, (t + trip(), state["calls"], "arrive", permit, False))

    def stalled_until(t: float) -> float | None:
        return next((end for start, end in stalls if start <= t < end), None)

    send(0.0)
    tick = 0.0
    while events and events[0][0] < until:
        t = events[0][0]
        if t > tick + 0.01:  # time alone moves the limiter too (a probe out long enough)
            tick = clock.now = min(t, tick + 0.01)
            if stalled_until(tick) is None:
                send(clock.now)
            continue
        t, call, what, permit, ok = heapq.heappop(events)
        resumed = stalled_until(t)
        if resumed is not None and what in ("answer", "refused", "spent", "wake"):
            heapq.heappush(events, (resumed + trips.uniform(0, 0.02), call, what, permit, ok))
            continue
        clock.now = tick = t
        if what == "arrive":
            arrive(t, call, permit)
        elif what == "free":
            state["serving"] -= 1
        elif what == "answer":
            state["done"].append(t)
            limit.release(permit, OK)
            spent = taken.pop(call)
            budget.ended(spent, answered=True)
            budget.observe(announced(t), spent)
        elif what == "spent":
            limit.release(permit, NOT_SENT)  # a spent budget is no concurrency refusal
            budget.ended(taken[call], answered=False)
            retry_after_s, headers = ok
            budget.refused(REQUESTS, retry_after_s, headers, taken.pop(call))
        elif what == "refused":
            limit.release(permit, OVERLOAD, retry_after)
            budget.ended(taken.pop(call), answered=False)
        if stalled_until(t) is None:
            send(t)
    return {**state, "limit": limit}


def stalls_between(until: float, seed: int, shortest: float = 0.2, longest: float = 0.7) -> Stalls:
    """Stalls of `shortest` to `longest` seconds every 1 to 3 s, as the benchmark's fleets met on
    two cores."""
    rng, t, spans = random.Random(seed), 0.0, []
    while t < until:
        t += rng.uniform(1.0, 3.0)
        spans.append((t, t + rng.uniform(shortest, longest)))
        t = spans[-1][1]
    return tuple(spans)


# -- what a run did

def completions(done: list[float], start: float, end: float) -> int:
    return sum(start <= t < end for t in done)


def busy_seconds(busy: list[tuple[float, float]], start: float, end: float) -> float:
    """The slot-seconds served calls held at the service between `start` and `end`."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in busy)


def busy_share(busy: list[tuple[float, float]], start: float, end: float, service_limit: int) -> float:
    """The share of the service's slot-seconds between `start` and `end` that served calls."""
    return busy_seconds(busy, start, end) / (service_limit * (end - start))


def capacity(schedule: Schedule, start: float, end: float) -> float:
    """The slot-seconds the service offered between `start` and `end`: its limit in force,
    integrated over the schedule's spans."""
    ends = [at for at, _ in schedule[1:]] + [math.inf]
    return sum(lim * max(0.0, min(until, end) - max(at, start))
               for (at, lim), until in zip(schedule, ends, strict=True))


def used_share(busy: list[tuple[float, float]], schedule: Schedule, start: float, end: float) -> float:
    """The share of the capacity in force between `start` and `end` that served calls (a service
    whose limit moves is measured against the limit of each moment, as the benchmark does)."""
    return busy_seconds(busy, start, end) / capacity(schedule, start, end)


def refused_share(run: dict[str, Any], start: float) -> float:
    """429s over the calls that reached the service from `start` (served or refused), as the
    service counts them."""
    refused = sum(t >= start for t in run["refused_at"])
    served = sum(a >= start for a, _ in run["busy"])
    return refused / (refused + served) if refused + served else 0.0


def recovered_after(run: dict[str, Any], change: float, service_limit: int, mean: float) -> float:
    """Seconds from `change` until the service's slots are 90 % busy over a window of a mean
    latency (the benchmark's recovery rule, counted at the service)."""
    t = change
    while t < change + 30 * mean:
        if busy_share(run["busy"], t, t + mean, service_limit) >= 0.9:
            return t - change
        t += mean / 20
    return math.inf
