"""The jars Spark needs beyond PySpark: the Kafka connector and the PostgreSQL JDBC driver.

`make jars` resolves them from Maven Central (`infra/spark/pom.xml`) into `.local/jars/spark`;
`SPARK_JARS` (comma-separated paths) overrides that folder. Free of pyspark imports, so DAG files
can name the jars for `spark-submit` while they are parsed.
"""

from __future__ import annotations

import os
from pathlib import Path

JARS_DIR = Path(__file__).resolve().parent.parent / ".local" / "jars" / "spark"


def resolved_jars() -> str:
    """Comma-separated paths of the jars in JARS_DIR; empty when none are resolved."""
    return ",".join(str(p) for p in sorted(JARS_DIR.glob("*.jar")))


def connector_jars() -> str:
    """Comma-separated jar paths for `spark.jars` / `--jars`: SPARK_JARS, else the resolved ones."""
    return os.environ.get("SPARK_JARS") or resolved_jars()
