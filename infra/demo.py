"""The main job end to end on the local stack: `pipeline_tuning` through `airflow dags test`,
then the gate report (capacity, throughput and utilization with their intervals, every check,
the decision) and where the plots are.

    python -m infra.demo                # flow at a fast time scale (0.3: the 3 s generation takes 0.9 s)
    SCALE=1 python -m infra.demo        # real AI latencies (3 s per generation)
    CANDIDATE=baseline python -m infra.demo
    PIPELINE=text_moderation python -m infra.demo   # any spec in pipelines/

Three trials of a 160-request burst keep it to a few minutes at either scale. The candidate is
a preset built at SCALE (`active` re-measures the active version at its own time scale).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
from psycopg2.extensions import connection

from infra.layout import REPO, Layout, current

FINISHED = ("success", "failed", "skipped", "upstream_failed", "removed")
TASKS_SQL = ("SELECT ti.task_id, ti.state, ti.start_date, ti.end_date FROM task_instance ti "
             "JOIN dag_run r ON r.dag_id = ti.dag_id AND r.run_id = ti.run_id "
             "WHERE r.dag_id = %s AND r.logical_date = %s ORDER BY ti.start_date NULLS LAST, ti.task_id")


def run_dag(layout: Layout, dag_id: str, conf: dict) -> tuple[str, str]:
    """`airflow dags test` one run with its output in .local/<stack>/<dag_id>.log, each task shown
    as it starts and ends; return its state (from the metadata database) and the run's logical
    date in ts_nodash form."""
    logical_date = datetime.now(UTC).replace(microsecond=0)
    airflow = str(Path(sys.executable).parent / "airflow")
    started = time.monotonic()
    print(f"running {dag_id} with {json.dumps(conf)} (log: .local/{layout.name}/{dag_id}.log)")
    with open(layout.root / f"{dag_id}.log", "w") as log, \
            closing(psycopg2.connect(layout.database_url("airflow"))) as conn:
        conn.autocommit = True
        cmd = [airflow, "dags", "test", dag_id, logical_date.isoformat(), "-c", json.dumps(conf)]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        follow_tasks(conn, dag_id, logical_date, proc)
        with conn.cursor() as cur:
            cur.execute("SELECT state FROM dag_run WHERE dag_id = %s AND logical_date = %s",
                        (dag_id, logical_date.isoformat()))
            row = cur.fetchone()
    state = row[0] if row else "missing"
    print(f"{dag_id}: {state} in {time.monotonic() - started:.0f}s")
    return state, logical_date.strftime("%Y%m%dt%H%M%S")


def follow_tasks(conn: connection, dag_id: str, logical_date: datetime, proc: subprocess.Popen) -> None:
    """Until `proc` ends: each task of the run printed when it starts and when it ends, with the
    time it took, as the run's own task instances record them."""
    shown: dict[str, str] = {}
    while True:
        ended = proc.poll() is not None  # read once more after the end: the last task's state
        with conn.cursor() as cur:
            cur.execute(TASKS_SQL, (dag_id, logical_date.isoformat()))
            tasks = cur.fetchall()
        for task_id, state, start, end in tasks:
            if state in FINISHED and shown.get(task_id) != "ended":
                took = f" in {(end - start).total_seconds():.0f}s" if start and end else ""
                print(f"  {(end or datetime.now(UTC)).astimezone(UTC):%H:%M:%S} {task_id} {state}{took}")
                shown[task_id] = "ended"
            elif start and task_id not in shown:
                print(f"  {start.astimezone(UTC):%H:%M:%S} {task_id} started")
                shown[task_id] = "started"
        if ended:
            return
        time.sleep(1)


def run_and_show(layout: Layout, dag_id: str, conf: dict, result: str, plots: tuple[str, ...]) -> int:
    """`run_dag`, then print the run's result file (`result`, a glob under results/ with `{ts}`
    for the run's logical date) and where its `plots` are: the command's exit status (1, saying
    where its log is, when the run did not succeed)."""
    state, ts = run_dag(layout, dag_id, conf)
    found = sorted((REPO / "results").glob(result.format(ts=ts)))
    if state != "success" or not found:
        print(f"the run did not finish: see .local/{layout.name}/{dag_id}.log", file=sys.stderr)
        return 1
    print(found[-1].read_text())
    print("plots: " + ", ".join(str(found[-1].parent / name) for name in plots))
    return 0


def main() -> int:
    layout = current()
    conf = {"candidate": os.environ.get("CANDIDATE", "flow"),
            "pipeline": os.environ.get("PIPELINE", "genai_image"),
            "time_scale": float(os.environ.get("SCALE", "0.3")), "burst": 160}
    return run_and_show(layout, "pipeline_tuning", conf, "tuning-{ts}-*/gate.txt",
                        ("completions.png", "requests_per_partition.png"))


if __name__ == "__main__":
    sys.exit(main())
