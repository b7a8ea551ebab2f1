"""Benchmark output: a terminal table, summary.json, per-second CSV, PNG plots, results/latest."""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from measure import cost

RESULTS = Path(__file__).resolve().parent.parent / "results"
COLUMNS = ("brokers", "throughput_rps", "steady_throughput_rps", "capacity_rps", "binding_limit",
           "utilization", "lost", "duplicate_ai_calls", "rebalances", "skew_max_over_mean", "skew_cv",
           "p50_ms", "p95_ms", "p99_ms", "overhead_p99_ms", "refetch_amplification", "span_s",
           "physical_minimum_s", "span_over_minimum", "ai_429", "overload_share")
COST_ROWS = (("tokens_input_per_request", "tokens per completed request, input"),
             ("tokens_output_per_request", "tokens per completed request, output"),
             ("cost_per_1k_requests", "cost per 1,000 completed requests"),
             ("failed_cost", "cost of failed calls"), ("paid_twice_cost", "cost of calls paid twice"))
STEADY_COLUMNS = ("rate_rps", "lost", "p50_ms", "p99_ms", "overhead_p50_ms", "overhead_p99_ms",
                  "late_wakeups", "latest_wakeup_ms", "cpu_busy_pct", "cpu_steal_pct")


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
    save(completions_figure(rows, summary.get("ai_capacity_rps")), out / "completions.png")
    partitions = {n: s["requests_per_partition"] for n, s in summary["scenarios"].items()
                  if "requests_per_partition" in s}  # the Router peer has none
    if partitions:
        save(partitions_figure(partitions), out / "requests_per_partition.png")
    for name, scenario in summary["scenarios"].items():
        if "adaptive" in scenario:
            save(adaptive_figure(name, scenario, series[name]), out / "adaptive.png")
    latest = RESULTS / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(out.name)
    return out


def save(fig: Figure, path: Path) -> None:
    """Write a figure as a PNG and let it go (pyplot keeps every open figure)."""
    fig.savefig(path, dpi=110)
    plt.close(fig)


def completions_figure(rows: dict[str, list[int]], capacity: float | None) -> Figure:
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
    return fig


def adaptive_figure(name: str, scenario: dict[str, Any], times: list[float]) -> Figure:
    """The limit the fleet discovered beside the one in force; with budgets learned from the
    answers (a gateway's), the requests budget learned beside the gateway's and the calls served
    on the bottleneck; and throughput (completions over the last mean call, per second) beside the
    capacity in force, against time since the first produce."""
    adaptive = scenario["adaptive"]
    first, call_s = scenario["first_produced_s"], adaptive["service_s"]
    relative = sorted(t - first for t in times)
    budgets = adaptive.get("discovered_budgets", [])
    fig, axes = plt.subplots(3 if budgets else 2, 1, figsize=(9, 8.5 if budgets else 6), sharex=True)
    limits, rates = axes[0], axes[-1]
    end = relative[-1] if relative else 1.0
    for label, points, style in (("limit in force at the service", adaptive["service_limits"], "--"),
                                 ("limit discovered by the fleet", adaptive["discovered_limits"], "-")):
        if points:
            xs, ys = zip(*[(max(0.0, at), limit) for at, limit in points], strict=True)
            limits.step([*xs, end], [*ys, ys[-1]], where="post", linestyle=style, label=label)
    limits.set(ylabel="calls in flight", title=f"{name}: {adaptive['stage']} concurrency limit")
    limits.legend()
    if budgets:
        _plot_budget(axes[1], adaptive, budgets, end)
    grid = [i * call_s / 4 for i in range(1, int(end / call_s * 4) + 1)]
    rate = _rate(relative, grid, call_s)
    rates.plot(grid, rate, label="completions per second (over one call)")
    capacity = [(max(0.0, at), limit / call_s) for at, limit in adaptive["service_limits"]]
    xs, ys = zip(*capacity, strict=True)
    rates.step([*xs, end], [*ys, ys[-1]], where="post", color="grey", linestyle="--",
               label="capacity in force (concurrency)")
    if budgets and scenario.get("capacity_rps"):  # a budget binds: the concurrency's capacity is far off
        rates.axhline(scenario["capacity_rps"], color="black", linestyle=":",
                      label=f"capacity ({scenario.get('binding_limit')})")
        rates.set_ylim(0, 2 * max([scenario["capacity_rps"], *rate]))
    rates.set(xlabel="seconds since the first request was produced", ylabel="requests/s")
    rates.legend()
    fig.tight_layout()
    return fig


BUDGET_WINDOW_S = 10.0  # the calls served per second are counted over this much


def _plot_budget(ax: Any, adaptive: dict[str, Any], budgets: list[list[Any]], end: float) -> None:
    """The budgets the fleet learned, in calls per second (a tokens budget over the run's tokens
    per call), the gateway's, the turns of a window learned from the answers, and the
    bottleneck's calls served per second over BUDGET_WINDOW_S."""
    per_call = {"requests": 1.0, "tokens": adaptive.get("tokens_per_call")}
    for kind in ("requests", "tokens"):
        learned = [(max(0.0, at), per_minute / 60 / per_call[kind])
                   for at, k, per_minute, _ in budgets if k == kind and per_call[kind]]
        if learned:
            xs, ys = zip(*learned, strict=True)
            ax.step([*xs, end], [*ys, ys[-1]], where="post", linewidth=4, alpha=0.5,
                    label=f"{kind} budget learned by the fleet" if kind == "requests" else
                    f"tokens budget learned by the fleet, in calls of {per_call[kind]:g} tokens")
    gateway = adaptive.get("gateway_budgets", {}).get("requests")
    if gateway:  # (drawn over the budget learned, which it should hide)
        ax.axhline(gateway / 60, color="black", linestyle="--", linewidth=1,
                   label="the gateway's requests per minute")
    for at, *_, turned in budgets:
        if turned:
            ax.axvline(at, color="grey", linestyle=":", linewidth=0.8)
    grid = [i * BUDGET_WINDOW_S / 4 for i in range(1, int(end / BUDGET_WINDOW_S * 4) + 1)]
    ax.plot(grid, _rate(adaptive["calls_ended"], grid, BUDGET_WINDOW_S),
            label=f"{adaptive['stage']} calls served per second (over {BUDGET_WINDOW_S:g} s)")
    ax.set(ylabel="calls/s", title=f"{adaptive['stage']} per-minute budget (dotted: window turns learned)")
    ax.legend()


def _rate(ordered: list[float], grid: list[float], window_s: float) -> list[float]:
    """Events per second of `ordered` (sorted) over the `window_s` before each point of `grid`."""
    return [(bisect.bisect_right(ordered, t) - bisect.bisect_right(ordered, t - window_s)) / window_s
            for t in grid]


def partitions_figure(per_partition: dict[str, list[int]]) -> Figure:
    """Each scenario's requests per partition of the measured topic."""
    fig, axes = plt.subplots(len(per_partition), 1, figsize=(9, 1.8 * len(per_partition) + 0.6),
                             sharex=True, squeeze=False)
    for ax, (name, counts) in zip(axes[:, 0], per_partition.items(), strict=True):
        ax.bar(range(len(counts)), counts, width=0.9)
        ax.set_ylabel("requests")
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("partition")
    fig.suptitle("Requests per partition")
    fig.tight_layout()
    return fig


def _busiest(scenario: dict[str, Any], stage: str) -> str:
    busiest = scenario.get("busiest_partition", {}).get(stage)
    return f"{busiest['requests']} / {busiest['ai_s']}" if busiest else "-"


def _adaptive(scenario: dict[str, Any], figure: str) -> str:
    adaptive = scenario.get("adaptive")
    if adaptive is None:
        return "-"
    if figure == "utilization":
        return str(adaptive["utilization_in_force"])
    return ", ".join(f"{r['recovery_s']} ({r['recovery_real_s']})" for r in adaptive["recoveries"])


def _served(scenario: dict[str, Any]) -> str:
    """The stand-in's served calls/s on the binding endpoint over the span, of what its limit allows."""
    check = scenario.get("served_on_binding")
    if not check:
        return "-"
    return f"{check['served_rps']} of {check['limit_calls_rps']} ({check['share_of_limit']})"


def _overload(scenario: dict[str, Any]) -> str:
    """Each endpoint's 429s of its calls, and their share."""
    return "; ".join(f"{name} {o['ai_429']} / {o['ai_calls']} ({o['overload_share']})"
                     for name, o in scenario.get("overload_by_endpoint", {}).items()) or "-"


def _outcomes(scenario: dict[str, Any]) -> str:
    """How the Router peer's requests ended (bench/peer.py)."""
    peer = scenario.get("peer")
    return " / ".join(str(n) for n in peer["outcomes"].values()) if peer else "-"


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
    table.add_row("stand-in served/s on the binding endpoint over the span", *(_served(s) for s in scenarios))
    table.add_row("429s / calls per endpoint (share)", *(_overload(s) for s in scenarios))
    if any("peer" in s for s in scenarios):
        table.add_row("Router's requests: ok / rate-limited / error", *(_outcomes(s) for s in scenarios))
    for key, label in COST_ROWS:
        table.add_row(label, *(cost.shown(s["cost"][key]) if "cost" in s else "-" for s in scenarios))
    for stage in sorted({stage for s in scenarios for stage in s.get("busiest_partition", {})}):
        table.add_row(f"busiest {stage} partition: requests / AI s", *(_busiest(s, stage) for s in scenarios))
    for column in STEADY_COLUMNS:
        table.add_row(f"steady phase {column}", *(str(s["steady"].get(column)) if "steady" in s else "-"
                                                  for s in scenarios))
    table.add_row("adaptive: utilization in force", *(_adaptive(s, "utilization") for s in scenarios))
    table.add_row("adaptive: recovery s (real-scale s)", *(_adaptive(s, "recovery") for s in scenarios))
    console.print(table)
    for key in ("ratios", "producer_vs_perftest", "pause_benchmark", "spark_partition_load"):
        if key in summary:
            console.print(f"[bold]{key}[/bold]: {json.dumps(summary[key], default=str)}")
