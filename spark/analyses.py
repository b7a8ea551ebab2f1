"""Several analysis jobs in one Spark application: each job's name, then its own arguments, jobs
separated by `--`.

    spark-submit spark/analyses.py partition_load --topics a,b --run-id r -- \\
        pipeline_analysis --run-id r-t1,r-t2 --final-stage generate

A tuning run analyses its trials with two jobs; as two spark-submits each paid the JVM's start,
the executors' launch on the master and the first queries' compilation before any work, one
after the other. Here the jobs share one session (`spark.session.build` gets the one that
exists) and run side by side, each in a thread of its own: they read different sources
(Kafka, PostgreSQL) and write different tables, and each is mostly small Spark jobs whose
scheduling the other's work fills. The application fails when any job fails, after all ended.

With `remote` (a Spark Connect URL; `main` called in-process, as the Airflow task does when the
stack's Connect server is configured) there is no application to start: each job runs in a
session of its own on the server, whose JVM is already warm.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: import the project from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from spark import partition_load, pipeline_analysis
from spark.session import build, connect_mode

JOBS: dict[str, Callable[[list[str]], Any]] = {
    "partition_load": partition_load.main,
    "pipeline_analysis": pipeline_analysis.main,
}
SEPARATOR = "--"


def split(argv: Sequence[str]) -> list[tuple[str, list[str]]]:
    """[(job, its arguments)] from `job args... -- job args...`."""
    jobs: list[tuple[str, list[str]]] = []
    current: list[str] = []
    for arg in [*argv, SEPARATOR]:
        if arg != SEPARATOR:
            current.append(arg)
            continue
        if not current:
            raise SystemExit("an empty job: give a job's name after each --")
        name, *args = current
        if name not in JOBS:
            raise SystemExit(f"unknown job {name!r}; known: {', '.join(JOBS)}")
        jobs.append((name, args))
        current = []
    return jobs


def main(argv: list[str] | None = None, *, remote: str | None = None) -> list[Any]:
    """Run every job given side by side, on the Connect server at `remote` when given; return
    their results in the order given."""
    jobs = split(sys.argv[1:] if argv is None else argv)
    if remote:
        jobs = [(name, [*args, "--remote", remote]) for name, args in jobs]
    else:
        build("analyses")  # before the threads: each job's build() then gets this session
    # Connect columns until the last job ends, not only until the first one's session does.
    with connect_mode() if remote else nullcontext(), ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        running = [pool.submit(JOBS[name], args) for name, args in jobs]
    return [job.result() for job in running]


if __name__ == "__main__":
    main()
