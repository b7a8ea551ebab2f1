"""The Spark session every job uses: master and connector jars from the environment.

`SPARK_MASTER` selects `local[*]` (default) or a `spark://` cluster; `SPARK_JARS` lists the
Kafka connector and JDBC driver jars (comma-separated) that `make jars` puts in
`.local/jars/spark`. Jars go through `spark.jars`, not `spark.jars.packages`, because Ivy
would bypass the Maven resolution the project pins.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pyspark.sql import SparkSession

DEFAULT_JARS_DIR = Path(__file__).resolve().parent.parent / ".local" / "jars" / "spark"


def connector_jars() -> str:
    """Comma-separated jar paths for `spark.jars`."""
    listed = os.environ.get("SPARK_JARS", "")
    if listed:
        return listed
    jars = sorted(str(p) for p in DEFAULT_JARS_DIR.glob("*.jar"))
    if not jars:
        raise RuntimeError(f"no connector jars in {DEFAULT_JARS_DIR}: run `make jars`")
    return ",".join(jars)


def build(app_name: str, master: str | None = None) -> SparkSession:
    """A session with the Kafka connector and the PostgreSQL driver on its class path."""
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or os.environ.get("SPARK_MASTER", "local[*]"))
        .config("spark.jars", connector_jars())
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", os.environ.get("SPARK_SHUFFLE_PARTITIONS", "8"))
        .config("spark.ui.showConsoleProgress", "false")
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per gateway call otherwise
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
