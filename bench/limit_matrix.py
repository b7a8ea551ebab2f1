"""The adaptive concurrency limit against a simulated service, over shapes it was not tuned on
(a benchmark, not a test: it prints and saves figures, and exits 0 whatever they are).

    python -m bench.limit_matrix              # make limit-matrix
    python -m bench.limit_matrix --seeds 10   # each cell with seeds 1 to 10 (default 5)

The simulation (`simulate`) is the one tests/unit/test_concurrency_limit.py checks the limiter
against: a service refusing past a concurrency limit that follows a schedule, fed through
`AdaptiveLimit` by a caller with unlimited work. The matrix runs it over latency shapes (one
median), schedules of the service's limit and stalls of the calling process. Each cell's figures
are counted at the service after a warm-up: the share of the capacity in force that served
calls (busy slot-seconds over the slot-seconds of the limit in force) and the share of the calls
reaching it that were refused. The target is at least 0.95 of the one with at most 1 % of the
other, in the worst of the seeds. A table on the terminal, the figures in
results/limit-matrix.json.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from consumers.ai.concurrency_limit import NOT_SENT, OK, OVERLOAD, AdaptiveLimit, Permit
from consumers.ai.rate_budget import REQUESTS, RateBudget, Spent

Draw = Callable[[random.Random], float]
Schedule = list[tuple[float, int]]  # (from when, the service's limit), the first at 0
Stalls = tuple[tuple[float, float], ...]
Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile


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


# -- the matrix

MEDIAN = 1.2  # s, every shape's: the tests' heavy-tailed median, so shapes differ only in their tails
PHASE = 40 * MEDIAN  # a schedule's phase, as the benchmark's burst holds each limit
UNTIL = 3 * PHASE
WARM_UP = 10 * MEDIAN  # the start (a limit of 20 climbing blind) is not counted
LAG = 0.005  # s each way between caller and service, the simulation's default
USED_TARGET, REFUSED_TARGET = 0.95, 0.01
OUT = Path(__file__).resolve().parent.parent / "results" / "limit-matrix.json"

SHAPES: dict[str, Draw] = {
    "fixed": fixed(MEDIAN),
    **{f"lognormal σ {sigma}": lognormal(MEDIAN, MEDIAN * math.exp(sigma * Z99))
       for sigma in (0.3, 0.6, 1.0, 1.5)},
    "pareto α 1.5": pareto(MEDIAN, 1.5),
    "bimodal 10 % at 8x": bimodal(MEDIAN, 0.1, 8.0),
}


def drift(start: int, end: int, steps: int) -> Schedule:
    """From `start` to `end` in `steps` even steps over the run, the last a step before its end."""
    every, size = UNTIL / (steps + 1), (start - end) / steps
    return [(0.0, start)] + [(k * every, round(start - k * size)) for k in range(1, steps + 1)]


SCHEDULES: dict[str, Schedule] = {
    "steady 64": [(0.0, 64)],
    "down 64→32": [(0.0, 64), (PHASE, 32)],
    "up 32→64": [(0.0, 32), (PHASE, 64)],
    "down-up 64→32→64": [(0.0, 64), (PHASE, 32), (2 * PHASE, 64)],
    "drift 64→40": drift(64, 40, 12),
}
STALLS: dict[str, Callable[[int], Stalls]] = {
    "runs": lambda seed: (),
    "stalls 0.1-0.7 s": lambda seed: stalls_between(UNTIL, seed, shortest=0.1, longest=0.7),
}


def cell(shape: str, schedule: str, stalls: str, seed: int) -> tuple[float, float]:
    """One run of a cell: (the share of the capacity in force used, the share of calls refused)."""
    run = simulate(SCHEDULES[schedule], UNTIL, SHAPES[shape], lag=LAG, seed=seed, stalls=STALLS[stalls](seed))
    return used_share(run["busy"], SCHEDULES[schedule], WARM_UP, UNTIL), refused_share(run, WARM_UP)


def summary(runs: list[tuple[float, float]]) -> dict[str, Any]:
    """A cell over its seeds: each run, the worst and the mean of each figure, and whether the
    worst holds the target (a cell that holds it only on average does not)."""
    used, refused = [u for u, _ in runs], [r for _, r in runs]
    worst = {"used": min(used), "refused": max(refused)}
    return {"runs": [{"used": u, "refused": r} for u, r in runs], "worst": worst,
            "mean": {"used": statistics.fmean(used), "refused": statistics.fmean(refused)},
            "holds": worst["used"] >= USED_TARGET and worst["refused"] <= REFUSED_TARGET}


def run_matrix(seeds: int, workers: int, progress: Progress) -> list[dict[str, Any]]:
    """Every cell with each seed, on `workers` processes (each run is independent and CPU-bound)."""
    keys = [(shape, schedule, stalls) for shape in SHAPES for stalls in STALLS for schedule in SCHEDULES]
    task = progress.add_task("simulating", total=len(keys) * seeds)
    runs: dict[tuple[str, str, str], dict[int, tuple[float, float]]] = {key: {} for key in keys}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(cell, *key, seed): (key, seed) for key in keys for seed in range(1, seeds + 1)}
        for future in as_completed(futures):
            key, seed = futures[future]
            runs[key][seed] = future.result()
            progress.advance(task)
    return [{"shape": shape, "schedule": schedule, "stalls": stalls,
             **summary([runs[(shape, schedule, stalls)][seed] for seed in range(1, seeds + 1)])}
            for shape, schedule, stalls in keys]


def figures(entry: dict[str, Any], seeds: int) -> str:
    """A cell of the table: the worst of each figure, the means under them when there are seeds
    to take a mean of; a cell that misses the target is marked."""
    worst, mean = entry["worst"], entry["mean"]
    text = f"{worst['used']:.3f} {100 * worst['refused']:.2f}%"
    if seeds > 1:
        text += f"\n[dim]{mean['used']:.3f} {100 * mean['refused']:.2f}%[/dim]"
    return text if entry["holds"] else f"[red]✗ {text}[/red]"


def table(cells: list[dict[str, Any]], seeds: int) -> Table:
    """Shapes and stalls down, schedules across: one table of every cell's two figures."""
    caption = (f"capacity in force used, 429s / calls: the worst of {seeds} seed(s)"
               + (", the mean under it" if seeds > 1 else "")
               + f"; ✗ under {USED_TARGET} used or over {100 * REFUSED_TARGET:.0f} % refused")
    out = Table(title="The adaptive limit on a simulated service", caption=caption, show_lines=seeds > 1)
    out.add_column("latency")
    out.add_column("caller")
    for schedule in SCHEDULES:
        out.add_column(schedule, justify="right")
    by_key = {(c["shape"], c["stalls"], c["schedule"]): c for c in cells}
    for shape in SHAPES:
        for stalls in STALLS:
            row = (figures(by_key[(shape, stalls, schedule)], seeds) for schedule in SCHEDULES)
            out.add_row(shape, stalls, *row)
    return out


def save(cells: list[dict[str, Any]], seeds: int, elapsed_s: float) -> Path:
    """results/limit-matrix.json: the settings the figures hold for, and every cell."""
    OUT.parent.mkdir(parents=True, exist_ok=True)
    settings = {"median_s": MEDIAN, "phase_s": PHASE, "until_s": UNTIL, "warm_up_s": WARM_UP,
                "lag_s": LAG, "seeds": seeds, "target": {"used": USED_TARGET, "refused": REFUSED_TARGET},
                "schedules": SCHEDULES}
    OUT.write_text(json.dumps({"settings": settings, "elapsed_s": round(elapsed_s, 1), "cells": cells},
                              indent=2, ensure_ascii=False))
    return OUT


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5,
                   help="runs of each cell, seeded 1 to N (default %(default)s)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="processes the runs share (default: one per core)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    started = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        cells = run_matrix(args.seeds, args.workers, progress)
    elapsed = time.monotonic() - started
    console.print(table(cells, args.seeds))
    held = sum(c["holds"] for c in cells)
    console.print(f"{held} of {len(cells)} cells hold the target; {elapsed:.0f} s; "
                  f"figures in {save(cells, args.seeds, elapsed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
