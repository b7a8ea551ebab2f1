"""What every analysis job shares: its command line, its JDBC source and where results go.

Results are small (one row per partition, one document per run), so they are written with
psycopg2 in one transaction rather than through Spark's JDBC writer, and reruns for the same
run id replace the earlier rows instead of adding to them.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg2
from psycopg2.extras import Json, execute_values
from pyspark.sql import DataFrame, SparkSession

from consumers.config import kafka_connection

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def add_common_args(parser: argparse.ArgumentParser, *, kafka: bool = False, jdbc: bool = False,
                    spark: bool = True) -> None:
    """The options every job takes, plus the Kafka, JDBC and Spark ones for jobs that use them."""
    parser.add_argument("--run-id", help="key of the results in the analysis tables")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""),
                        help="libpq URL of the pipeline database, where results are written "
                             "(default $DATABASE_URL; empty: no write)")
    parser.add_argument("--output-json", type=Path, help="also write the results to this JSON file")
    if jdbc:
        parser.add_argument("--jdbc-url", help="JDBC URL to read from (default: derived from --database-url)")
    if spark:
        parser.add_argument("--master", help="Spark master (default: spark-submit's, else spark.master in "
                            "$SPARK_CONF_DIR/spark-defaults.conf, else local[*])")
        parser.add_argument("--remote", metavar="URL",
                            help="a Spark Connect server (sc://host:port/;token=...) to run in, instead "
                                 "of starting Spark (the stack's is $SPARK_CONNECT_URL)")
    if kafka:
        kafka_connection.add_argument(parser)
        parser.add_argument("--topics", type=lambda s: [t for t in s.split(",") if t], required=True,
                            help="comma-separated topic names")


def default_run_id(prefix: str) -> str:
    """A run id for ad hoc runs that were given none."""
    return f"{prefix}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"


@dataclass(frozen=True)
class Jdbc:
    """A JDBC source: URL plus the credentials the libpq URL carried."""

    url: str
    user: str | None = None
    password: str | None = None

    def options(self) -> dict[str, str]:
        opts = {"url": self.url, "driver": "org.postgresql.Driver"}
        if self.user:
            opts["user"] = self.user
        if self.password:
            opts["password"] = self.password
        return opts


def jdbc_from(database_url: str, jdbc_url: str | None = None) -> Jdbc:
    """JDBC settings from a libpq URL (`postgresql://user:pw@host:port/db`), or an explicit URL.

    The JDBC driver does not take credentials in the authority part, so they move to options;
    with an explicit JDBC URL, the libpq URL (when given) still supplies them.
    """
    if not database_url and not jdbc_url:
        raise ValueError("no database: pass --jdbc-url or --database-url (or set DATABASE_URL)")
    parts = urlsplit(database_url or "")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    if not jdbc_url:
        port = f":{parts.port}" if parts.port else ""
        query = f"?{parts.query}" if parts.query else ""
        jdbc_url = f"jdbc:postgresql://{parts.hostname or 'localhost'}{port}{parts.path}{query}"
    return Jdbc(jdbc_url, user, password)


def sql_literal(value: str) -> str:
    """A PostgreSQL string literal (standard_conforming_strings: only quotes need doubling)."""
    return "'" + value.replace("'", "''") + "'"


def read_query(spark: SparkSession, jdbc: Jdbc, query: str) -> DataFrame:
    """A JDBC read of one query, so its WHERE clause runs in PostgreSQL."""
    return spark.read.format("jdbc").options(**jdbc.options()).option("query", query).load()


def collect_sorted(frame: DataFrame, *order: str) -> list[dict[str, Any]]:
    """The rows of a small result as dicts, sorted by `order` in the driver, nulls first as
    Spark sorts them. Sorting in Spark before `collect` costs a sampling job and a shuffle per
    result, most of a small job's time when a run has dozens of results."""
    def key(row: dict[str, Any]) -> tuple:
        return tuple((row[name] is not None, row[name]) for name in order)

    return sorted((row.asDict() for row in frame.collect()), key=key)


def utc_iso(epoch_seconds: int | None) -> str | None:
    """An ISO-8601 UTC instant for JSON output (whole seconds, e.g. a bucket start)."""
    return None if epoch_seconds is None else datetime.fromtimestamp(epoch_seconds, UTC).isoformat()


def utc_iso_us(epoch_micros: int | None) -> str | None:
    """An ISO-8601 UTC instant from epoch microseconds, exact (no float rounding)."""
    return None if epoch_micros is None else (EPOCH + timedelta(microseconds=epoch_micros)).isoformat()


def write_json(path: Path | None, document: Mapping[str, Any]) -> None:
    """Write the results document when a path was given."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def replace_rows(database_url: str, table: str, scope: Mapping[str, Any], columns: Sequence[str],
                 rows: Iterable[Sequence[Any]]) -> None:
    """Replace the rows of `table` matching `scope` (e.g. run id and topic) with `rows`.

    Delete-then-insert in one transaction, so a rerun that sees fewer partitions or buckets
    leaves no stale rows behind. `scope` values are prepended to every row.
    """
    where = " AND ".join(f"{name} = %s" for name in scope)
    names = ", ".join([*scope, *columns])
    fixed = tuple(scope.values())
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(f"DELETE FROM {table} WHERE {where}", fixed)
        execute_values(cur, f"INSERT INTO {table} ({names}) VALUES %s", [fixed + tuple(r) for r in rows])
    conn.close()


def upsert_figures(database_url: str, table: str, run_id: str, figures: Mapping[str, Any]) -> None:
    """Store one run's figures document in a `(run_id, figures, computed_at)` table."""
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {table} (run_id, figures, computed_at) VALUES (%s, %s, now()) "
                    "ON CONFLICT (run_id) DO UPDATE SET figures = EXCLUDED.figures, "
                    "computed_at = EXCLUDED.computed_at", (run_id, Json(figures)))
    conn.close()
