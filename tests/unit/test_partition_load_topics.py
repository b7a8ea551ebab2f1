"""partition_load carries a record's topic as an id through the aggregation and names it again after."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark import partition_load


def test_topic_ids_number_the_listed_topics_and_names_restore_them(spark: SparkSession) -> None:
    records = spark.createDataFrame([("b", 0), ("a", 1), ("b", 2)], "topic string, partition int")
    ids = partition_load.topic_ids(records, ["a", "b"])
    assert sorted(tuple(r) for r in ids.collect()) == [(1, 1), (2, 0), (2, 2)]
    names = partition_load.topic_names(ids, ["a", "b"])
    assert sorted(tuple(r) for r in names.collect()) == [("a", 1), ("b", 0), ("b", 2)]


def test_records_of_unlisted_topics_are_left_out_of_every_figure(spark: SparkSession) -> None:
    records = spark.createDataFrame(
        [("t", 0, 0, 10, b"k1", 1_000), ("t", 1, 0, 10, b"k2", 1_000), ("other", 0, 0, 10, b"k3", 1_000)],
        "topic string, partition int, offset long, bytes int, key binary, ts_ms long")
    result = partition_load.analyse(records, {"t": 2})
    assert [(p["topic"], p["partition"], p["records"]) for p in result.partitions] == [("t", 0, 1),
                                                                                         ("t", 1, 1)]
    assert {b["topic"] for b in result.buckets} == {"t"}
    assert [s["topic"] for s in result.skew] == ["t"]
