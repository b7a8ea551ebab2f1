"""The Spark session every job uses: master and connector jars from the environment.

`SPARK_MASTER` selects `local[*]` (default) or a `spark://` cluster; the jars come from
`spark/jars.py`. They go through `spark.jars`, not `spark.jars.packages`, because Ivy would
bypass the Maven resolution the project pins.
"""

from __future__ import annotations

import logging
import os

from pyspark.sql import SparkSession

from spark.jars import JARS_DIR, connector_jars


def build(app_name: str, master: str | None = None) -> SparkSession:
    """A session with the Kafka connector and the PostgreSQL driver on its class path."""
    jars = connector_jars()
    if not jars:
        raise RuntimeError(f"no connector jars in {JARS_DIR}: run `make jars`")
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or os.environ.get("SPARK_MASTER", "local[*]"))
        .config("spark.jars", jars)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", os.environ.get("SPARK_SHUFFLE_PARTITIONS", "8"))
        .config("spark.ui.showConsoleProgress", "false")
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per gateway call otherwise
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
