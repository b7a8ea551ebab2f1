"""Output of a fault-injection run: faults.json, a rich table and faults.png in results/<run id>/."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from bench.fault_figures import RECOVERY_SHARE, exited_fleets
from bench.report import run_dir, save


def write(summary: dict[str, Any]) -> Path:
    """faults.json and faults.png for the run; its folder."""
    out = run_dir(summary["run_id"])
    (out / "faults.json").write_text(json.dumps(summary, indent=2, default=str))
    plot(summary["phases"], summary["load_rps"], out / "faults.png")
    return out


def _reasons(dead_letters: dict[str, dict[str, int]]) -> str:
    table, topic = dead_letters.get("table", {}), dead_letters.get("topic", {})
    reasons = sorted(set(table) | set(topic))
    return "\n".join(f"{r} {table.get(r, 0)}/{topic.get(r, 0)}" for r in reasons) or "0"


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _fleets_kept(phase: dict[str, Any]) -> str | None:
    if "fleet_pids" not in phase:
        return None
    exited = exited_fleets(phase["fleet_pids"])
    return "exited: " + ", ".join(exited) if exited else "yes"


def _poison(phase: dict[str, Any]) -> str | None:
    poison = phase.get("poison")
    return None if poison is None else f"{poison['dead_lettered_once']} of {poison['expected']}"


ROWS: tuple[tuple[str, Any], ...] = (
    ("fault lasted s", lambda p: p.get("fault_s")),
    ("produced", lambda p: p.get("produced")),
    ("completed", lambda p: p.get("completed")),
    ("dead-lettered (table/topic)", lambda p: _reasons(p["dead_letters"]) if "dead_letters" in p else None),
    ("lost", lambda p: p.get("lost")),
    ("duplicate results", lambda p: p.get("duplicate_results")),
    ("final messages resent", lambda p: p.get("resent_notifications")),
    ("duplicate AI calls (rows)", lambda p: p.get("duplicate_ai_calls")),
    ("served twice (AI service)", lambda p: p.get("service_duplicates")),
    ("served twice allowed", lambda p: p.get("allowed_service_duplicates")),
    ("outputs seen twice (read_committed)", lambda p: p.get("duplicate_outputs")),
    ("uncommitted records", lambda p: sum(p["uncommitted"].values()) if "uncommitted" in p else None),
    ("pre-fault completions/s", lambda p: p.get("pre_fault_rps")),
    ("completions/s during it", lambda p: p.get("fault_rps")),
    ("longest stall s", lambda p: p.get("longest_stall_s")),
    ("recovery s (to 90 %)", lambda p: p.get("recovery_s")),
    ("fleet processes kept", _fleets_kept),
    ("failed by design: lettered once", _poison),
)


def print_table(summary: dict[str, Any], console: Console) -> None:
    """Faults side by side (figures as rows), then why each failing fault failed."""
    if not console.is_terminal:
        console = Console(width=160)  # a log file gets every column
    phases = summary["phases"]
    table = Table(title=f"fault injection {summary['run_id']}: load {summary['load_rps']:.1f} rps, "
                        f"AI capacity {summary['capacity_rps']:.1f} rps, time scale {summary['time_scale']}")
    table.add_column("figure")
    for phase in phases:
        table.add_column(phase["fault"], justify="right")
    for label, figure in ROWS:
        table.add_row(label, *(_cell(figure(p)) for p in phases))
    table.add_row("verdict", *("[green]pass" if not p["failures"] else "[red]FAIL" for p in phases))
    console.print(table)
    for phase in phases:
        for failure in phase["failures"]:
            console.print(f"[red]{phase['fault']}[/red]: {failure}")


def plot(phases: list[dict[str, Any]], load_rps: float, path: Path) -> None:
    save(figure(phases, load_rps), path)


def figure(phases: list[dict[str, Any]], load_rps: float) -> Figure:
    """Completions per second over each phase against the offered load, the fault's window
    shaded, the pre-fault rate and the recovery threshold drawn, the recovery marked."""
    columns = 2
    rows = math.ceil(len(phases) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(12, 3.2 * rows), squeeze=False)
    for ax, phase in zip(axes.flat, phases, strict=False):
        counts = phase.get("completions_per_second") or []
        ax.step(range(len(counts)), counts, where="post", linewidth=1, label="completions/s")
        ax.axhline(load_rps, color="tab:blue", linestyle="-.", linewidth=0.8, alpha=0.6, label="load")
        start = phase.get("load_started")
        if start is not None and phase.get("fault_start") is not None:
            begin, end = phase["fault_start"] - start, phase["fault_end"] - start
            ax.axvspan(begin, max(end, begin + 0.5), color="tab:red", alpha=0.2, label="fault")
            if phase.get("recovery_s") is not None:
                ax.axvline(end + phase["recovery_s"], color="tab:green", linestyle="-", linewidth=1,
                           label="recovered")
        if phase.get("pre_fault_rps"):
            ax.axhline(phase["pre_fault_rps"], color="grey", linestyle="--", linewidth=1,
                       label="pre-fault rate")
            ax.axhline(RECOVERY_SHARE * phase["pre_fault_rps"], color="grey", linestyle=":", linewidth=1,
                       label=f"{RECOVERY_SHARE:.0%} of it")
        verdict = "pass" if not phase["failures"] else "FAIL"
        ax.set_title(f"{phase['fault']}: {verdict}, lost {_cell(phase.get('lost'))}, "
                     f"recovered in {_cell(phase.get('recovery_s'))} s", fontsize=10, loc="left")
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
