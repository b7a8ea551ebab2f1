"""Benchmark output: a terminal table, summary.json, per-second CSV, PNG plots, results/latest."""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).resolve().parent.parent / "results"
COLUMNS = ("throughput_rps", "steady_throughput_rps", "capacity_rps", "utilization", "lost",
           "duplicate_ai_calls", "rebalances", "skew_max_over_mean", "skew_cv", "p50_ms", "p95_ms",
           "p99_ms", "overhead_p99_ms", "refetch_amplification", "span_s")


def run_dir(run_id: str) -> Path:
    path = RESULTS / run_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def per_second(times: list[float], start: float) -> list[int]:
    """Completions in each second since `start`."""
    if not times:
        return []
    counts = [0] * (math.floor(max(times) - start) + 1)
    for t in times:
        counts[max(0, math.floor(t - start))] += 1
    return counts


def write(summary: dict[str, Any], series: dict[str, list[float]], starts: dict[str, float]) -> Path:
    """Save everything for one benchmark run; return its folder."""
    out = run_dir(summary["run_id"])
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    rows = {name: per_second(times, starts[name]) for name, times in series.items()}
    with open(out / "completions_per_second.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["second", *rows])
        for second in range(max((len(r) for r in rows.values()), default=0)):
            writer.writerow([second, *(r[second] if second < len(r) else 0 for r in rows.values())])
    _plot_completions(rows, summary.get("ai_capacity_rps"), out / "completions.png")
    _plot_partitions({n: s["requests_per_partition"] for n, s in summary["scenarios"].items()},
                     out / "requests_per_partition.png")
    latest = RESULTS / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(out.name)
    return out


def _plot_completions(rows: dict[str, list[int]], capacity: float | None, path: Path) -> None:
    """Cumulative completions: the slope is the throughput, and the 3 s waves of per-second
    counts do not hide it."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    longest = max((len(c) for c in rows.values()), default=0)
    for name, counts in rows.items():
        ax.plot(range(1, len(counts) + 1), list(itertools.accumulate(counts)), label=name, linewidth=1.5)
    if capacity and longest:
        ax.plot([0, longest], [0, capacity * longest], color="grey", linestyle="--", linewidth=1,
                label=f"AI capacity ({capacity:.1f} rps)")
        ax.set_ylim(0, 1.05 * max(sum(c) for c in rows.values()))
    ax.set(xlabel="seconds since the load started", ylabel="completed requests",
           title="Completions over time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_partitions(per_partition: dict[str, list[int]], path: Path) -> None:
    fig, axes = plt.subplots(len(per_partition), 1, figsize=(9, 1.8 * len(per_partition) + 0.6),
                             sharex=True, squeeze=False)
    for ax, (name, counts) in zip(axes[:, 0], per_partition.items(), strict=True):
        ax.bar(range(len(counts)), counts, width=0.9)
        ax.set_ylabel("requests")
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("partition")
    fig.suptitle("Requests per partition")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _busiest(scenario: dict[str, Any], stage: str) -> str:
    busiest = scenario.get("busiest_partition", {}).get(stage)
    return f"{busiest['requests']} / {busiest['ai_s']}" if busiest else "-"


def print_table(summary: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"run {summary['run_id']}  time scale {summary['time_scale']}  "
                        f"AI capacity {summary['ai_capacity_rps']:.1f} rps")
    table.add_column("figure")
    for name in summary["scenarios"]:
        table.add_column(name, justify="right")
    scenarios = list(summary["scenarios"].values())
    for column in COLUMNS:
        table.add_row(column, *(str(s.get(column)) for s in scenarios))
    for stage in sorted({stage for s in scenarios for stage in s.get("busiest_partition", {})}):
        table.add_row(f"busiest {stage} partition: requests / AI s", *(_busiest(s, stage) for s in scenarios))
    console.print(table)
    for key in ("ratios", "producer_vs_perftest", "pause_benchmark"):
        if key in summary:
            console.print(f"[bold]{key}[/bold]: {json.dumps(summary[key], default=str)}")
