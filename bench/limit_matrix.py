"""The adaptive concurrency limit against a simulated service, over shapes it was not tuned on
(a benchmark, not a test: it prints and saves figures, and exits 0 whatever they are).

    python -m bench.limit_matrix              # make limit-matrix
    python -m bench.limit_matrix --seeds 10   # each cell with seeds 1 to 10 (default 5)

The simulation (`bench.limit_simulation`) is the one tests/unit/test_concurrency_limit.py checks
the limiter against: a service refusing past a concurrency limit that follows a schedule, fed through
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
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.limit_simulation import (
    Draw,
    Schedule,
    Stalls,
    bimodal,
    fixed,
    lognormal,
    pareto,
    refused_share,
    simulate,
    stalls_between,
    used_share,
)
from consumers.config.pipeline_spec.endpoints import Z99

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
