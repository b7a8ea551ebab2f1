"""Spark for a local stack: a configuration directory always, a standalone cluster on request.

Every stack writes `.local/<stack>/spark/conf/spark-defaults.conf` and exports its folder as
`SPARK_CONF_DIR`, so a plain `spark-submit spark/partition_load.py ...` from the project's
environment finds the Kafka connector and JDBC jars (`spark.jars`, by path), the project's
Python for driver and executors, and the stack's master, with no `--jars` to remember.

`SPARK=cluster` also starts a standalone master and one worker with the PySpark wheel's own
`spark-class` (the wheel ships no start scripts), logs and work folders under
`.local/<stack>/spark/`; the stack's `spark_default` connection and `spark.master` then point at
`spark://127.0.0.1:<port>`, in client deploy mode (standalone refuses Python applications in
cluster mode). `local[*]` stays the default.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from host.processes import alive, spawn, tail, terminate
from infra.layout import Layout, chosen, port_in_use, wait_for_port
from spark.jars import resolved_jars
from spark.session import QUICK_JIT

LOCAL, CLUSTER = "local", "cluster"
MODES = (LOCAL, CLUSTER)
WORKER_CORES = 2
WORKER_MEMORY = "2g"


def mode() -> str:
    """How `up` runs Spark: SPARK, `local` (default) or `cluster`."""
    return chosen("SPARK", MODES)


def folder(layout: Layout) -> Path:
    return layout.root / "spark"


def conf_dir(layout: Layout) -> Path:
    return folder(layout) / "conf"


def master_url(layout: Layout, spark: str) -> str:
    return f"spark://127.0.0.1:{layout.spark_master_port}" if spark == CLUSTER else "local[*]"


def status_url(layout: Layout) -> str:
    """The master's status as JSON (its web UI's /json): workers, running and completed apps."""
    return f"http://127.0.0.1:{layout.spark_master_ui_port}/json/"


def write_conf(layout: Layout, spark: str) -> Path:
    """spark-defaults.conf for the stack; returns the folder to export as SPARK_CONF_DIR."""
    settings = {
        "spark.master": master_url(layout, spark),
        "spark.submit.deployMode": "client",
        "spark.jars": resolved_jars(),
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": QUICK_JIT,  # jobs of seconds here (spark/session.py)
        "spark.executor.extraJavaOptions": QUICK_JIT,
    }
    conf = conf_dir(layout)
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in settings.items()))
    return conf


def environment(layout: Layout) -> dict[str, str]:
    return {**os.environ, "SPARK_LOG_DIR": str(folder(layout) / "logs"),
            "SPARK_CONF_DIR": str(conf_dir(layout)), "PYSPARK_PYTHON": sys.executable}


def _spark_class(main_class: str, *args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "spark-class"), main_class, *args]


def start(layout: Layout, timeout_s: float = 90.0) -> dict[str, int]:
    """Start the master and a worker (those not running); wait until the worker registered."""
    env, logs = environment(layout), folder(layout) / "logs"
    master = spawn(_spark_class("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                "--port", str(layout.spark_master_port),
                                "--webui-port", str(layout.spark_master_ui_port)),
                   logs / "master.log", env=env)
    if not wait_for_port(layout.spark_master_port, timeout_s):
        raise RuntimeError(f"Spark master did not start:\n{tail(logs / 'master.log')}")
    work = folder(layout) / "work"
    work.mkdir(parents=True, exist_ok=True)
    worker = spawn(_spark_class("org.apache.spark.deploy.worker.Worker", master_url(layout, CLUSTER),
                                "--host", "127.0.0.1", "--webui-port", str(layout.spark_worker_ui_port),
                                "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                                "--work-dir", str(work)),
                   logs / "worker.log", env=env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(worker):
            raise RuntimeError(f"Spark worker exited during start-up:\n{tail(logs / 'worker.log')}")
        if any(w.get("state") == "ALIVE" for w in status(layout).get("workers", [])):
            return {"master": master, "worker": worker}
        time.sleep(0.5)
    raise RuntimeError(f"no Spark worker registered with the master in {timeout_s:.0f}s")


def status(layout: Layout) -> dict:
    """The master's JSON status, or {} when it does not answer."""
    try:
        with urllib.request.urlopen(status_url(layout), timeout=5) as response:
            return json.load(response)
    except OSError:
        return {}


def stop(pids: dict[str, int]) -> None:
    """The worker first (it kills its executors), then the master."""
    for role in ("worker", "master"):
        terminate(pids.get(role), grace_s=20.0)


def running(pids: dict[str, int], layout: Layout) -> bool:
    return all(alive(pids.get(role)) for role in ("master", "worker")) and \
        port_in_use(layout.spark_master_port)
