"""The Spark session every job uses: the connector jars, and the master it was given, or a
session on a Spark Connect server.

The master is the job's `--master` when given; otherwise what spark-submit was told (its
`--master`, as `SparkSubmitOperator` passes the `spark_default` connection's), else
`spark.master` of `$SPARK_CONF_DIR/spark-defaults.conf` (the stack writes one), else local[*]:
a job never overrides the master it was submitted to. The jars come from `spark/jars.py`. They
go through `spark.jars`, not `spark.jars.packages`, because Ivy would bypass the Maven
resolution the project pins.

With `--remote` (a Connect URL, `sc://...`) a job starts no JVM: it runs in a session of its
own on a long-lived server (the stack's, `infra/spark_connect.py`), which was started with
`server_conf()` and whose JVM is already warm. The session gets the SQL settings only
(`sql_conf()`); the others are the server's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import cast

from pyspark.sql import SparkSession

from host.processes import environment
from spark.jars import JARS_DIR, connector_jars

# Why each of these, with its measurements: docs/analysis.md, "How the scan is made fast".
# A short job pays more for the JIT's optimising tier (C2) than it saves: C1 only.
QUICK_JIT = "-XX:TieredStopAtLevel=1"
# A scan of millions of records: the parallel collector, a 4 GiB heap, and C2 only for methods
# called 100,000 times (every task builds a Kafka consumer, whose set-up code C2 would compile).
LONG_SCAN_JVM = "-XX:+UseParallelGC -XX:Tier4InvocationThreshold=100000 -XX:Tier4CompileThreshold=150000"
LONG_SCAN_MEMORY = "4g"
# The connector pools each task's consumer and last poll for a later task of the same group, five
# minutes by default; a batch query's group is its own, so they are never taken again and only
# fill the old generation of a session that runs several scans. Let go after a second.
KAFKA_POOL_IDLE = "1s"
KAFKA_POOLS = ("spark.kafka.consumer.cache", "spark.kafka.consumer.fetchedData.cache")
# Kafka left out of the V1 sources: the V2 source produces internal rows directly, where V1 hands
# every record over as an external row that is converted back.
V1_SOURCES = "avro,csv,json,orc,parquet,text"  # Spark's default, kafka left out
# PySpark's functions (F.col, F.length("key"), ...) build Connect columns only while this is set
# (pyspark.sql.utils.is_remote); PySpark's own builder sets it for good once it makes a remote
# session, which would turn the classic sessions built later in the process into clients too.
CONNECT_MODE = {"SPARK_CONNECT_MODE_ENABLED": "1"}


def server_conf() -> dict[str, str]:
    """What a JVM takes when it starts: the connector jars and the Kafka pools' eviction."""
    jars = connector_jars()
    if not jars:
        raise RuntimeError(f"no connector jars in {JARS_DIR}: run `make jars`")
    conf = {"spark.jars": jars, "spark.ui.showConsoleProgress": "false"}
    for pool in KAFKA_POOLS:
        conf |= {f"{pool}.timeout": KAFKA_POOL_IDLE, f"{pool}.evictorThreadRunInterval": KAFKA_POOL_IDLE}
    return conf


def sql_conf() -> dict[str, str]:
    """What each session sets for itself: UTC, the shuffle's partitions, the V2 Kafka source."""
    return {"spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": os.environ.get("SPARK_SHUFFLE_PARTITIONS", "8"),
            "spark.sql.sources.useV1SourceList": V1_SOURCES}


def build(app_name: str, master: str | None = None, *, long_scan: bool = False) -> SparkSession:
    """A session with the Kafka connector and the PostgreSQL driver on its class path, and
    QUICK_JIT as the local stacks give their jobs, or with `long_scan` LONG_SCAN_JVM and
    LONG_SCAN_MEMORY, whatever spark-defaults.conf says (they apply when this process starts the
    JVM: `python -m`, the benchmark, the tests, not a session spark-submit already made)."""
    builder = SparkSession.builder.appName(app_name)
    for name, value in {**server_conf(), **sql_conf()}.items():
        builder = builder.config(name, value)
    if master:
        builder = builder.master(master)
    jvm = LONG_SCAN_JVM if long_scan else QUICK_JIT
    builder = (builder.config("spark.driver.extraJavaOptions", jvm)
               .config("spark.executor.extraJavaOptions", jvm))
    if long_scan:
        builder = builder.config("spark.driver.memory", LONG_SCAN_MEMORY)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per gateway call otherwise
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def remote(url: str) -> SparkSession:
    """A new session on the Spark Connect server at `url`, with `sql_conf()`; use it inside
    `connect_mode()`. Imported here: the client's modules take seconds to import, which a
    spark-submit driver need not pay. The Connect session serves the DataFrame API the jobs use,
    though it is no subclass of the classic session."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    builder = RemoteSession.builder.remote(url)
    for name, value in sql_conf().items():
        builder = builder.config(name, value)
    return cast(SparkSession, builder.create())


def connect_mode() -> AbstractContextManager[None]:
    """PySpark's functions building Connect columns while the block runs (CONNECT_MODE)."""
    return environment(CONNECT_MODE)


@contextmanager
def session(app_name: str, master: str | None = None, *, long_scan: bool = False) -> Iterator[SparkSession]:
    """A built session, stopped on leaving: a long-lived process (the benchmark, a test run) must
    not keep an application on the stack's standalone master, whose cores the DAGs' jobs wait for."""
    spark = build(app_name, master, long_scan=long_scan)
    try:
        yield spark
    finally:
        spark.stop()


@contextmanager
def job_session(app_name: str, master: str | None = None, *, remote_url: str | None = None,
                own_settings: bool = False) -> Iterator[SparkSession]:
    """The session a job's main runs in. On a Connect server (`remote_url`): a session of its
    own, released on leaving, while the server runs on. Otherwise the application's (`build`),
    left running for spark-submit or spark/analyses.py to end; with `own_settings`, a new
    session over its context, whose SQL settings are the job's alone."""
    if remote_url:
        with connect_mode():
            spark = remote(remote_url)
            try:
                yield spark
            finally:
                spark.stop()
        return
    spark = build(app_name, master)
    yield spark.newSession() if own_settings else spark
