"""Benchmark: a tuning run's Spark analysis, wall time, the ways it has run side by side on the
same trials (not a test).

- `two-submits`: the jobs as two spark-submits, one after the other (the design before
  spark/analyses.py);
- `submit`: one spark-submit of spark/analyses.py, as the DAG's operator submits it without a
  Connect server;
- `connect`: spark/analyses.py on the stack's Spark Connect server (SPARK_CONNECT_URL), in a
  fresh Python process as the Airflow task runs it, the client's imports included.

Each round runs every way once, in that order, so the machine's drift falls on all of them;
the ratios compare medians. The trials are a finished tuning run's (`--key`, default the latest
the database has analysed), read from the stack in stack.env; the jobs rewrite that run's
analysis rows with the same figures. Results: a table on the console and
results/spark-analysis-<UTC time>/summary.json, with the load average before each run.

    python -m bench.spark_analysis --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
from rich.console import Console
from rich.table import Table

from spark.jars import connector_jars

REPO = Path(__file__).resolve().parent.parent
WAYS = ("two-submits", "submit", "connect")
# The Airflow task's side of `connect`: a new process that imports the jobs and runs them remotely.
CLIENT = ("import os, sys; from spark import analyses; "
          "analyses.main(sys.argv[1:], remote=os.environ['SPARK_CONNECT_URL'])")
# The target: the analysis's wall time at most half the two submits'.
TARGET_RATIO = 0.5


@dataclass(frozen=True)
class Trials:
    """A tuning run's analysis inputs: its key, its trials' run ids and measured topics."""

    key: str
    run_ids: list[str]
    topics: list[str]
    final_stage: str

    def jobs(self) -> list[list[str]]:
        return [["partition_load", "--topics", ",".join(self.topics), "--run-id", self.key],
                ["pipeline_analysis", "--run-id", ",".join(self.run_ids), "--final-stage", self.final_stage]]


def latest_trials(database_url: str, key: str | None, final_stage: str) -> Trials:
    """The trials of tuning run `key`, or of the latest one analysed, from its skew rows (one per
    trial's measured topic, `<trial run id>.<topic>`)."""
    with closing(psycopg2.connect(database_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id FROM analysis_skew WHERE run_id LIKE 'tuning-%%' "
                    "AND (%s IS NULL OR run_id = %s) ORDER BY computed_at DESC LIMIT 1", (key, key))
        found = cur.fetchone()
        if found is None:
            raise SystemExit("no analysed tuning run in the database: run pipeline_tuning first")
        cur.execute("SELECT topic FROM analysis_skew WHERE run_id = %s ORDER BY topic", found)
        topics = [row[0] for row in cur.fetchall()]
    return Trials(found[0], [t.rsplit(".", 1)[0] for t in topics], topics, final_stage)


def commands(way: str, trials: Trials) -> list[list[str]]:
    """The processes one analysis runs, one after the other."""
    bin_dir = Path(sys.executable).parent
    submit = [str(bin_dir / "spark-submit"), "--deploy-mode", "client", "--jars", connector_jars()]
    jobs = trials.jobs()
    if way == "two-submits":
        return [[*submit, str(REPO / "spark" / f"{job[0]}.py"), *job[1:]] for job in jobs]
    argv = [arg for i, job in enumerate(jobs) for arg in ([*(["--"] if i else []), *job])]
    if way == "submit":
        return [[*submit, str(REPO / "spark" / "analyses.py"), *argv]]
    return [[sys.executable, "-c", CLIENT, *argv]]


def timed(way: str, trials: Trials, log: Path) -> float:
    """One analysis's wall time; its output appended to `log`."""
    started = time.monotonic()
    with open(log, "a") as out:
        for command in commands(way, trials):
            subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=True,
                           env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    return time.monotonic() - started


def table(runs: Sequence[dict], trials: Trials) -> Table:
    out = Table(title=f"a tuning run's Spark analysis ({trials.key}, {len(trials.run_ids)} trials), wall s")
    for name in ("round", "1-min load before", *WAYS):
        out.add_column(name, justify="right")
    for i, run in enumerate(runs, 1):
        out.add_row(str(i), ", ".join(f"{load:.1f}" for load in run["load"]),
                    *(f"{run[way]:.1f}" for way in WAYS))
    return out


def ratios(runs: Sequence[dict]) -> dict[str, float]:
    median = {way: statistics.median(run[way] for run in runs) for way in WAYS}
    return {"connect/submit": median["connect"] / median["submit"],
            "connect/two-submits": median["connect"] / median["two-submits"],
            "submit/two-submits": median["submit"] / median["two-submits"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--key", help="the tuning run to analyse (default: the latest analysed)")
    parser.add_argument("--final-stage", default="generate", help="the pipeline's completing stage")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, each running every way once")
    parser.add_argument("--results-dir", type=Path, default=REPO / "results")
    args = parser.parse_args(argv)
    if "SPARK_CONNECT_URL" not in os.environ:
        parser.error("no SPARK_CONNECT_URL: source the stack's stack.env")
    trials = latest_trials(os.environ["DATABASE_URL"], args.key, args.final_stage)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.results_dir / f"spark-analysis-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    console, runs = Console(), []
    for _ in range(args.repeat):
        run: dict = {"load": []}
        for way in WAYS:
            run["load"].append(os.getloadavg()[0])
            run[way] = timed(way, trials, out_dir / f"{way}.log")
        runs.append(run)
        console.print(table(runs, trials))
    summary = {"started_at": stamp, "cpus": os.cpu_count(), "spark": os.environ.get("SPARK"),
               "trials": trials.__dict__, "runs": runs, "ratios": ratios(runs),
               "target": {"connect/two-submits_at_most": TARGET_RATIO}}
    console.print(summary["ratios"])
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"summary: {out_dir / 'summary.json'}")


if __name__ == "__main__":
    main()
