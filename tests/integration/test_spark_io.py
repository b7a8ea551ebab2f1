"""PySpark reads Kafka through the official connector and PostgreSQL through JDBC."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import unquote, urlsplit

import psycopg2
import pytest
from pyspark.sql import SparkSession

from spark.session import build
from tests.integration.kafka_helpers import create_topic, produce
from tests.stack import Stack, unique


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = build("integration-io")
    yield session
    session.stop()


def test_spark_reads_replicated_topic(stack: Stack, spark: SparkSession) -> None:
    topic = unique("spark-read")
    replication = min(3, stack.brokers)
    create_topic(stack.connection, topic, partitions=3, replication=replication,
                 config={"min.insync.replicas": str(min(2, replication))})
    sent = [f"event-{i}" for i in range(300)]
    assert produce(stack.connection, topic, sent, acks="all") == []

    frame = (spark.read.format("kafka")
             .options(**stack.connection.spark_options())
             .option("subscribe", topic)
             .option("startingOffsets", "earliest")
             .option("endingOffsets", "latest")
             .load())
    rows = frame.selectExpr("CAST(value AS STRING) AS value", "partition").collect()

    assert sorted(r.value for r in rows) == sorted(sent)
    assert {r.partition for r in rows} == {0, 1, 2}


def test_spark_reads_postgres_table_over_jdbc(stack: Stack, spark: SparkSession) -> None:
    table = unique("spark_jdbc").replace("-", "_")
    expected = {(i, f"name-{i}") for i in range(25)}
    with psycopg2.connect(stack.database_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, name text NOT NULL)")
        cur.executemany(f"INSERT INTO {table} VALUES (%s, %s)", sorted(expected))
    try:
        url = urlsplit(stack.database_url)  # JDBC takes the credentials as options
        frame = (spark.read.format("jdbc")
                 .option("url", f"jdbc:postgresql://{url.hostname}:{url.port}{url.path}")
                 .option("user", unquote(url.username))
                 .option("password", unquote(url.password))
                 .option("dbtable", table)
                 .option("driver", "org.postgresql.Driver")
                 .load())
        assert {(r.id, r.name) for r in frame.collect()} == expected
    finally:
        with psycopg2.connect(stack.database_url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP TABLE {table}")
