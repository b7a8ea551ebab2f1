"""What the tests know about the running stack: addresses from its env file, and helpers."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg2

from consumers.config.kafka_connection import KafkaAccess, KafkaConnection
from infra import spark_cluster
from infra.layout import Layout

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DagTestRun:
    state: str
    output: str
    logical_date: str

    @property
    def ts_nodash(self) -> str:
        return datetime.fromisoformat(self.logical_date).strftime("%Y%m%dT%H%M%S")


@dataclass(frozen=True)
class Stack:
    """The stack under test."""

    layout: Layout
    env: dict[str, str]

    @property
    def kafka(self) -> KafkaAccess:
        """The stack's principals (on an open stack, just its bootstrap list)."""
        access = KafkaAccess.from_environment(self.env)
        assert access is not None, f"no Kafka connection in {self.layout.env_file}"
        return access

    @property
    def connection(self) -> KafkaConnection:
        """The admin's connection."""
        return self.kafka.default

    @property
    def brokers(self) -> int:
        return int(self.env["KAFKA_BROKERS"])

    @property
    def database_url(self) -> str:
        return self.env["DATABASE_URL"]

    def spark_master_status(self) -> dict:
        """The stack's standalone master: its workers, running and completed applications."""
        with urllib.request.urlopen(spark_cluster.status_url(self.layout), timeout=10) as response:
            return json.load(response)

    def subprocess_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def _unused_second(self) -> datetime:
        """Now, to the second, unless a DAG test run on this stack took that second: runs on two
        workers may start in one, and a DAG's runs (and the pipeline runs named after their
        logical date) are told apart by it."""
        self.layout.root.mkdir(parents=True, exist_ok=True)
        taken = self.layout.root / "dag-test.second"
        with open(self.layout.root / "dag-test.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            now = datetime.now(UTC).replace(microsecond=0)
            while taken.exists() and taken.read_text() == now.isoformat():
                time.sleep(0.05)
                now = datetime.now(UTC).replace(microsecond=0)
            taken.write_text(now.isoformat())
        return now

    def run_dag(self, dag_id: str, conf: str | None = None, timeout_s: float = 900) -> DagTestRun:
        """`airflow dags test` one run; return its state (from the metadata DB) and output.

        The CLI logs task failures instead of exiting non-zero, so the run's state is read back
        from the metadata database by its unique logical date.
        """
        logical_date = self._unused_second().isoformat()
        # Only the DAG's own file is parsed (and written to the metadata database): the folder's
        # other DAGs cost each run seconds of CPU otherwise. Each DAG lives in dags/<dag_id>.py.
        cmd = [str(Path(sys.executable).parent / "airflow"), "dags", "test", dag_id, logical_date,
               "--dagfile-path", str(REPO / "dags" / f"{dag_id}.py")]
        if conf:
            cmd += ["-c", conf]
        proc = subprocess.run(cmd, env=self.subprocess_env(), capture_output=True, text=True,
                              timeout=timeout_s, cwd=REPO)
        with psycopg2.connect(self.layout.database_url("airflow")) as conn, conn.cursor() as cur:
            cur.execute("SELECT state FROM dag_run WHERE dag_id = %s AND logical_date = %s",
                        (dag_id, logical_date))
            row = cur.fetchone()
        return DagTestRun(row[0] if row else "missing", proc.stdout + proc.stderr, logical_date)


def java_properties(text: str) -> dict[str, str]:
    """The settings of a properties file the stack wrote (infra.kafka_cluster.properties), its
    escaped backslashes read back as one."""
    return dict(line.replace("\\\\", "\\").split("=", 1) for line in text.splitlines())


def unique(prefix: str) -> str:
    """A name no earlier test run used."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
