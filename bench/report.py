"""Benchmark output: a terminal table, summary.json, per-second CSV, PNG plots, results/latest.

Figures that every repetition measures are shown as their mean with its 95 % interval; the
others (a string, a nested breakdown) repetition by repetition, separated by ` | `."""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import math
from collections.abc import Callable
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


def column(name: str, repetition: int) -> str:
    """A scenario's repetition (counted from 1) as a column of the per-second CSV."""
    return f"{name}-{repetition}"


def write(summary: dict[str, Any], series: list[dict[str, list[float]]],
          starts: list[dict[str, float]]) -> Path:
    """Save everything for one benchmark run (its completions and load starts per repetition);
    return its folder."""
    out = run_dir(summary["run_id"])
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    rows = {column(name, i): per_second(times, starts[i - 1][name])
            for i, run in enumerate(series, 1) for name, times in run.items()}
    with open(out / "completions_per_second.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["second", *rows])
        for second in range(max((len(r) for r in rows.values()), default=0)):
            writer.writerow([second, *(r[second] if second < len(r) else 0 for r in rows.values())])
    save(completions_figure(series, starts, summary.get("ai_capacity_rps")), out / "completions.png")
    save(ratios_figure(summary["ratios"]), out / "ratios.png")
    first = summary["repetitions"][0]
    partitions = {n: s["requests_per_partition"] for n, s in first.items()
                  if "requests_per_partition" in s}  # the Router peer has none
    if partitions:
        save(partitions_figure(partitions), out / "requests_per_partition.png")
    for name, scenario in first.items():
        if "adaptive" in scenario:
            save(adaptive_figure(name, scenario, series[0][name]), out / "adaptive.png")
    latest = RESULTS / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(out.name)
    return out


def save(fig: Figure, path: Path) -> None:
    """Write a figure as a PNG and let it go (pyplot keeps every open figure)."""
    fig.savefig(path, dpi=110)
    plt.close(fig)


def completions_figure(series: list[dict[str, list[float]]], starts: list[dict[str, float]],
                       capacity: float | None) -> Figure:
    """Cumulative completions, one line per repetition in its scenario's colour: the slope is the
    throughput, the 3 s waves of per-second counts do not hide it, and the lines' spread is the
    repetitions'."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    colours = dict(zip(series[0], itertools.cycle(plt.rcParams["axes.prop_cycle"].by_key()["color"]),
                       strict=False))
    longest, most = 0, 0
    for i, run in enumerate(series):
        for name, times in run.items():
            counts = per_second(times, starts[i][name])
            longest, most = max(longest, len(counts)), max(most, sum(counts))
            ax.plot(range(1, len(counts) + 1), list(itertools.accumulate(counts)), color=colours[name],
                    label=None if i else name, linewidth=1.0 if i else 1.5, alpha=0.6 if i else 1.0)
    if capacity and longest:
        ax.plot([0, longest], [0, capacity * longest], color="grey", linestyle="--", linewidth=1,
                label=f"AI capacity ({capacity:.1f} rps)")
        ax.set_ylim(0, 1.05 * most)
    ax.set(xlabel="seconds since the load started", ylabel="completed requests",
           title="Completions over time")
    ax.legend()
    fig.tight_layout()
    return fig


def ratios_figure(ratios: dict[str, dict[str, Any] | None]) -> Figure:
    """Each comparison's mean with its 95 % interval and every repetition's value: a bar that
    crosses the line of no difference is inside the noise. A difference of points is drawn as
    1 + points / 100, on the ratios' axis."""
    shown = [(name, r) for name, r in ratios.items() if r is not None]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(shown) + 1.5))
    for y, (name, r) in enumerate(shown):
        def x(value: float, points: bool = name.endswith("_points")) -> float:
            return 1 + value / 100 if points else value

        if r["low"] is not None:
            ax.plot([x(r["low"]), x(r["high"])], [y, y], color="tab:blue", linewidth=3, solid_capstyle="butt")
        ax.plot([x(v) for v in r["values"]], [y] * len(r["values"]), "o", color="black", markersize=3)
        ax.plot(x(r["mean"]), y, "|", color="tab:red", markersize=14)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(shown)), [n.replace("_", " ") for n, _ in shown])
    ax.set(xlabel="ratio: mean (red), 95 % interval (blue), repetitions (dots)",
           title="Scenarios compared, repetition by repetition")
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


def _field(scenario: dict[str, Any], *path: str) -> str:
    """The figure at `path` (a name, or a part's name and the figure's), "-" where none is."""
    found: Any = scenario
    for key in path:
        if not isinstance(found, dict) or key not in found:
            return "-"
        found = found[key]
    return str(found)


def _cpu(scenario: dict[str, Any]) -> str:
    spent = scenario.get("cpu_s") or {}
    return ", ".join(f"{role} {seconds:g}" for role, seconds in list(spent.items())[:4]) or "-"


def _cost(scenario: dict[str, Any], key: str) -> str:
    return cost.shown(scenario["cost"][key]) if "cost" in scenario else "-"


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


MACHINE_COLUMNS = ("cpu_busy_pct", "late_wakeups", "latest_wakeup_ms")


def interval(figure: dict[str, Any] | None) -> str:
    """A repeated figure as `mean [low, high]`, or its one value."""
    if figure is None:
        return "-"
    if figure["low"] is None:
        return str(figure["mean"])
    return f"{figure['mean']:g} [{figure['low']:g}, {figure['high']:g}]"


def print_table(summary: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    runs = summary["repetitions"]
    table = Table(title=f"run {summary['run_id']}  time scale {summary['time_scale']}  "
                        f"AI capacity {summary['ai_capacity_rps']:.1f} rps  "
                        f"{summary['repeat']} repetition(s): mean [95 % interval]")
    table.add_column("figure")
    names = list(summary["scenarios"])
    for name in names:
        table.add_column(name, justify="right")

    def each(show: Callable[..., str], *args: str) -> list[str]:
        """One cell per scenario: `show(figures, *args)` of every repetition that ran it."""
        return [" | ".join(show(run[name], *args) for run in runs if name in run) for name in names]

    for figure in COLUMNS:
        per_run = each(_field, figure)
        table.add_row(figure, *(interval(summary["scenarios"][n][figure]) if figure in summary["scenarios"][n]
                                else per_run[i] for i, n in enumerate(names)))
    for figure in MACHINE_COLUMNS:
        table.add_row(f"burst: machine {figure}",
                      *each(_field, "machine", figure))
    table.add_row("burst: CPU s by process (the four busiest)", *each(_cpu))
    table.add_row("stand-in served/s on the binding endpoint over the span", *each(_served))
    table.add_row("429s / calls per endpoint (share)", *each(_overload))
    if any("peer" in s for run in runs for s in run.values()):
        table.add_row("Router's requests: ok / rate-limited / error", *each(_outcomes))
    for key, label in COST_ROWS:
        table.add_row(label, *each(_cost, key))
    stages = {stage for run in runs for s in run.values() for stage in s.get("busiest_partition", {})}
    for stage in sorted(stages):
        table.add_row(f"busiest {stage} partition: requests / AI s",
                      *each(_busiest, stage))
    for figure in STEADY_COLUMNS:
        table.add_row(f"steady phase {figure}",
                      *each(_field, "steady", figure))
    table.add_row("adaptive: utilization in force", *each(_adaptive, "utilization"))
    table.add_row("adaptive: recovery s (real-scale s)", *each(_adaptive, "recovery"))
    console.print(table)
    ratios = Table(title="scenarios compared within each repetition: mean [95 % interval]")
    for header in ("comparison", "mean [95 % interval]", "repetitions", "inside the noise"):
        ratios.add_column(header)
    for name, r in summary["ratios"].items():
        if r is not None:
            ratios.add_row(name, interval(r), ", ".join(f"{v:g}" for v in r["values"]),
                           "-" if r["within_noise"] is None else ("yes" if r["within_noise"] else "no"))
    console.print(ratios)
    for key in ("producer_vs_perftest", "pause_benchmark", "spark_partition_load"):
        if key in summary:
            console.print(f"[bold]{key}[/bold]: {json.dumps(summary[key], default=str)}")
