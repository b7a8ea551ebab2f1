"""Output of a fault-injection run: faults.json, a rich table and faults.png in results/<run id>/."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from bench.fault_figures import RECOVERY_SHARE, exited_fleets
from bench.fault_record import FaultRun, PhaseFigures, PhaseRecord
from bench.report import run_dir, save


def write(run: FaultRun) -> Path:
    """faults.json and faults.png for the run; its folder."""
    out = run_dir(run.run_id)
    (out / "faults.json").write_text(json.dumps(run.to_json(), indent=2, default=str))
    plot(run.phases, run.load_rps, out / "faults.png")
    return out


def _reasons(dead_letters: dict[str, dict[str, int]]) -> str:
    table, topic = dead_letters["table"], dead_letters["topic"]
    reasons = sorted(set(table) | set(topic))
    return "\n".join(f"{r} {table.get(r, 0)}/{topic.get(r, 0)}" for r in reasons) or "0"


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _fleets_kept(phase: PhaseRecord) -> str | None:
    if phase.fleet_pids is None:
        return None
    exited = exited_fleets(phase.fleet_pids)
    return "exited: " + ", ".join(exited) if exited else "yes"


def _poison(f: PhaseFigures) -> str | None:
    return None if f.poison is None else f"{f.poison.dead_lettered_once} of {f.poison.expected}"


def _measured(figure: Callable[[PhaseFigures], Any]) -> Callable[[PhaseRecord], Any]:
    """A row of a figure, blank for a phase that got no figures."""
    return lambda p: None if p.figures is None else figure(p.figures)


ROWS: tuple[tuple[str, Callable[[PhaseRecord], Any]], ...] = (
    ("fault lasted s", lambda p: None if p.injection is None else p.injection.lasted_s),
    ("produced", lambda p: None if p.load is None else p.load.produced),
    ("completed", _measured(lambda f: f.completed)),
    ("dead-lettered (table/topic)", _measured(lambda f: _reasons(f.dead_letters))),
    ("lost", _measured(lambda f: f.lost)),
    ("duplicate results", _measured(lambda f: f.duplicate_results)),
    ("final messages resent", _measured(lambda f: f.resent_notifications)),
    ("duplicate AI calls (rows)", _measured(lambda f: f.duplicate_ai_calls)),
    ("served twice (AI service)", _measured(lambda f: f.service_duplicates)),
    ("served twice allowed", lambda p: p.allowed_service_duplicates),
    ("outputs seen twice (read_committed)", _measured(lambda f: f.duplicate_outputs)),
    ("uncommitted records", _measured(lambda f: sum(f.uncommitted.values()))),
    ("pre-fault completions/s", _measured(lambda f: f.pre_fault_rps)),
    ("completions/s during it", _measured(lambda f: f.fault_rps)),
    ("longest stall s", _measured(lambda f: f.longest_stall_s)),
    ("recovery s (to 90 %)", _measured(lambda f: f.recovery_s)),
    ("fleet processes kept", _fleets_kept),
    ("failed by design: lettered once", _measured(_poison)),
)


def print_table(run: FaultRun, console: Console) -> None:
    """Faults side by side (figures as rows), then why each failing fault failed."""
    if not console.is_terminal:
        console = Console(width=160)  # a log file gets every column
    phases = run.phases
    table = Table(title=f"fault injection {run.run_id}: load {run.load_rps:.1f} rps, "
                        f"AI capacity {run.capacity_rps:.1f} rps, time scale {run.time_scale}")
    table.add_column("figure")
    for phase in phases:
        table.add_column(phase.fault, justify="right")
    for label, figure in ROWS:
        table.add_row(label, *(_cell(figure(p)) for p in phases))
    table.add_row("verdict", *("[green]pass" if not p.failures else "[red]FAIL" for p in phases))
    console.print(table)
    for phase in phases:
        for failure in phase.failures:
            console.print(f"[red]{phase.fault}[/red]: {failure}")


def plot(phases: list[PhaseRecord], load_rps: float, path: Path) -> None:
    save(figure(phases, load_rps), path)


def figure(phases: list[PhaseRecord], load_rps: float) -> Figure:
    """Completions per second over each phase against the offered load, the fault's window
    shaded, the pre-fault rate and the recovery threshold drawn, the recovery marked."""
    columns = 2
    rows = math.ceil(len(phases) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(12, 3.2 * rows), squeeze=False)
    for ax, phase in zip(axes.flat, phases, strict=False):
        f = phase.figures
        counts = f.completions_per_second if f else []
        ax.step(range(len(counts)), counts, where="post", linewidth=1, label="completions/s")
        ax.axhline(load_rps, color="tab:blue", linestyle="-.", linewidth=0.8, alpha=0.6, label="load")
        if phase.load is not None and phase.injection is not None:
            begin, end = phase.injection.start - phase.load.started, phase.injection.end - phase.load.started
            ax.axvspan(begin, max(end, begin + 0.5), color="tab:red", alpha=0.2, label="fault")
            if f is not None and f.recovery_s is not None:
                ax.axvline(end + f.recovery_s, color="tab:green", linestyle="-", linewidth=1,
                           label="recovered")
        if f is not None and f.pre_fault_rps:
            ax.axhline(f.pre_fault_rps, color="grey", linestyle="--", linewidth=1, label="pre-fault rate")
            ax.axhline(RECOVERY_SHARE * f.pre_fault_rps, color="grey", linestyle=":", linewidth=1,
                       label=f"{RECOVERY_SHARE:.0%} of it")
        verdict = "pass" if not phase.failures else "FAIL"
        ax.set_title(f"{phase.fault}: {verdict}, lost {_cell(f.lost if f else None)}, "
                     f"recovered in {_cell(f.recovery_s if f else None)} s", fontsize=10, loc="left")
        ax.set(xlabel="seconds since the load started", ylabel="completions / s")
    for ax in list(axes.flat)[len(phases):]:
        ax.axis("off")
    labelled = {}  # one legend for every panel: the same lines in each
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            labelled.setdefault(label, handle)
    fig.legend(labelled.values(), labelled.keys(), loc="lower center", ncol=len(labelled), fontsize=8)
    fig.suptitle("Completions per second under each fault")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig
