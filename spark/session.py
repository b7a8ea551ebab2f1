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

# The JIT's optimising tier (C2) costs a job of seconds more CPU than it saves it: a tuning
# run's partition_load took 28.7 s instead of 40.8 s, and pipeline_analysis over three trials
# 26.5 s instead of 36.7 s, with C1 only. The local stacks set QUICK_JIT for drivers and
# executors (infra/spark_cluster.py); a scan of millions of records asks for LONG_SCAN_JVM.
QUICK_JIT = "-XX:TieredStopAtLevel=1"
# A scan of millions of records on two cores, measured here with partition_load over 10M
# records (three runs in each of two JVMs per setting, the first one cold):
# - the full JIT: with C1 only the bare scan's tasks spent 31 s of CPU instead of 7-8 s;
# - C2 only for methods called 100,000 times, not 5,000: every task builds a Kafka consumer, and
#   C2 otherwise compiles their set-up code (metrics, sensors), seconds of one core's time;
# - the parallel collector instead of G1, and a 4 GiB heap instead of 1 GiB.
# The job's warm runs took 15.3-19.9 s with the JVM's defaults (28-35 s of its CPU), 12.1-15.0 s
# with the C2 threshold and the parallel collector, 10.8-12.3 s with the 4 GiB heap as well
# (18-21 s of CPU); its cold runs 29.7-34.4 s against 22.8-24.4 s.
LONG_SCAN_JVM = "-XX:+UseParallelGC -XX:Tier4InvocationThreshold=100000 -XX:Tier4CompileThreshold=150000"
LONG_SCAN_MEMORY = "4g"
# The Kafka connector pools each task's consumer and its last poll when the task ends, for a
# later task of the same consumer group; a batch query has a group of its own, so nothing ever
# takes them again, and by default they stay 5 minutes, looked at once a minute. In a session
# that runs several scans (the benchmark, a test run, pipeline_analysis's trials) that is old
# generation a full collection walks: after one 10M-record partition_load over 64 partitions
# 257 MiB of byte arrays stayed live with the pooled consumers, 29 MiB without them, and the
# last polls held another 490,000 records. Idle pooled consumers and last polls go after a
# second, looked at every second: garbage collection took 0.3-0.5 s of a warm job instead of
# 1.0-1.6 s (full collections 0.1-0.4 s instead of 0.4-1.1 s; three sessions of four runs
# each), and the pool no longer outgrows its soft maximum of 64 consumers.
KAFKA_POOL_IDLE = "1s"
KAFKA_POOLS = ("spark.kafka.consumer.cache", "spark.kafka.consumer.fetchedData.cache")
# Spark reads Kafka in batch through its V1 source unless told otherwise, and that source hands
# every record over as an external Row that is converted back to an internal one (a profile of
# a 10M-record partition_load: a fifth of its CPU in those two conversions). Leaving kafka out of
# this list takes the connector's V2 source, which produces internal rows directly: the same job
# 9.7 s warm instead of 12.8 s, its bare read 12.9 s instead of 20.8 s, measured here.
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
