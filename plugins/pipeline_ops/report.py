"""The tuning run's report: the gate's checks as text and JSON, and plots of the run.

Files go to `results/<run id>/` (or $PIPELINE_RESULTS_DIR): gate.json, completions.png (final
stage completions per second, from the Spark analysis) and requests_per_partition.png.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from airflow.providers.postgres.hooks.postgres import PostgresHook

from consumers.events import Topics

RESULTS = Path(os.environ.get("PIPELINE_RESULTS_DIR",
                              Path(__file__).resolve().parents[2] / "results"))


def text(candidate: dict[str, Any], decision: dict[str, Any]) -> str:
    lines = [f"gate report for version {candidate['version']} ({candidate['name']}), "
             f"run {candidate['run_id']}", "  " + decision["summary"]]
    for check in decision["reasons"]:
        mark = "ok  " if check["passed"] else "FAIL"
        lines.append(f"  [{mark}] {check['name']:<20} measured {check['measured']}  "
                     f"required {check['required']}")
    return "\n".join(lines)


def write(hook: PostgresHook, candidate: dict[str, Any], decision: dict[str, Any]) -> Path:
    out = RESULTS / candidate["run_id"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "gate.json").write_text(json.dumps({"candidate": candidate, "decision": decision}, indent=2,
                                              default=str))
    (out / "gate.txt").write_text(text(candidate, decision) + "\n")
    _plot_completions(decision["figures"], hook, candidate["run_id"], out / "completions.png")
    _plot_partitions(hook, candidate["run_id"], out / "requests_per_partition.png")
    return out


def _plot_completions(figures: dict[str, Any], hook: PostgresHook, run_id: str, path: Path) -> None:
    rows = hook.get_records(
        "SELECT date_trunc('second', completed_at), count(*) FROM stage_results WHERE run_id = %s "
        "AND stage = 'generate' GROUP BY 1 ORDER BY 1", parameters=(run_id,))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if rows:
        start = rows[0][0]
        ax.bar([(t - start).total_seconds() for t, _ in rows], [n for _, n in rows], width=0.9)
    ax.set(xlabel="seconds", ylabel="completions / s",
           title=f"{run_id}: {figures['throughput_rps']:.1f} rps over the run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_partitions(hook: PostgresHook, run_id: str, path: Path) -> None:
    rows = hook.get_records("SELECT kafka_partition, records FROM analysis_partition_load WHERE "
                            "run_id = %s AND topic = %s ORDER BY 1",
                            parameters=(run_id, Topics(run_id).style))
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.bar([p for p, _ in rows], [n for _, n in rows], width=0.9)
    ax.set(xlabel="partition", ylabel="requests", title="requests per partition (style topic)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
