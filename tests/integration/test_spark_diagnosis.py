"""Why a topic is skewed, on the real broker: four topics written by Kafka's own producers, each
with its own cause, analysed by `spark-submit spark/analyses.py partition_load ...` as the DAGs
submit it, and the diagnosis of each read back from the job's JSON and the analysis tables."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import uuid
from collections import Counter
from contextlib import closing
from pathlib import Path

import psycopg2
import pytest

from consumers.kafka_clients.provisioning import delete
from infra import kafka_tools
from measure.skew import key_sample_size
from tests.integration.kafka_helpers import create_topic
from tests.stack import REPO, Stack, unique

PARTITIONS = 8
RECORDS = 20_000
HOT_SHARE = 0.2
# The sized topic must carry this rate; one partition's consumers take 100 records/s, so the
# formula asks for ceil(2000 / 100) = 20 partitions, and the topic has 8.
SIZING = {"target": 2000, "produce_per_partition": 50_000, "consume_per_partition": 100}
SIZED_PARTITIONS = math.ceil(SIZING["target"] / SIZING["consume_per_partition"])


def console_produce(stack: Stack, topic: str, lines: list[str]) -> None:
    """Keyed records (`key:value` lines) through Kafka's console producer (murmur2 hashing, as
    the Java client partitions keys)."""
    cmd = kafka_tools.command("console-producer", "--bootstrap-server", stack.connection.bootstrap,
                              "--topic", topic, "--property", "parse.key=true",
                              "--property", "key.separator=:", "--command-property", "linger.ms=20")
    proc = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]


def sticky_produce(stack: Stack, topic: str, records: int) -> None:
    """Keyless records through Kafka's ProducerPerformance, a burst that fits one batch: the
    sticky partitioner sends a batch's keyless records to one partition (seed 000's failure)."""
    proc = kafka_tools.run("producer-perf", "--topic", topic, "--num-records", str(records),
                           "--record-size", "100", "--throughput", "-1", "--producer-props",
                           f"bootstrap.servers={stack.connection.bootstrap}", "batch.size=1048576",
                           "linger.ms=200", capture=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def uuid_lines(n: int) -> list[str]:
    return [f"{uuid.uuid4()}:v{i}" for i in range(n)]


@pytest.fixture(scope="module")
def topics(stack: Stack):
    """{cause: topic}, written; the hot topic's key and its share of the records by hand."""
    names = {cause: unique(f"diagnosis-{cause}") for cause in
             ("balanced", "hot_key", "keyless_sticky", "too_few_partitions")}
    for name in names.values():
        create_topic(stack.connection, name, PARTITIONS)
    hot_key = f"hot-{uuid.uuid4().hex[:6]}"
    hot_lines = [f"{hot_key}:h{i}" for i in range(int(RECORDS * HOT_SHARE))]
    lines = hot_lines + uuid_lines(RECORDS - len(hot_lines))
    random.shuffle(lines)
    try:
        console_produce(stack, names["balanced"], uuid_lines(RECORDS))
        console_produce(stack, names["hot_key"], lines)
        sticky_produce(stack, names["keyless_sticky"], 4000)
        console_produce(stack, names["too_few_partitions"], uuid_lines(RECORDS))
        keys = Counter(line.split(":", 1)[0] for line in lines)
        yield names, hot_key, keys[hot_key] / len(lines)
    finally:
        delete(stack.connection, list(names.values()))


@pytest.fixture(scope="module")
def analysed(stack: Stack, topics, tmp_path_factory: pytest.TempPathFactory):
    """The job's document and what it stored, through spark-submit of the combined application."""
    names, _, _ = topics
    out = tmp_path_factory.mktemp("diagnosis")
    run_id, output = unique("diagnosis-run"), out / "load.json"
    env = {k: v for k, v in stack.subprocess_env().items() if k != "PYTHONPATH"}  # the script finds the repo
    env["PYSPARK_PYTHON"] = sys.executable
    sizing = json.dumps({names["too_few_partitions"]: SIZING})
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
           "--jars", stack.env["SPARK_JARS"], str(REPO / "spark" / "analyses.py"), "partition_load",
           "--topics", ",".join(names.values()), "--run-id", run_id, "--output-json", str(output),
           "--sizing-json", sizing]
    proc = subprocess.run(cmd, env=env, cwd=out, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with closing(psycopg2.connect(stack.database_url)) as conn, conn, conn.cursor() as cur:
        cur.execute("SELECT topic, diagnosis, recommendation FROM analysis_skew WHERE run_id = %s", (run_id,))
        skew = {topic: (cause, line) for topic, cause, line in cur.fetchall()}
        cur.execute("SELECT topic, kafka_partition, records, keyless, sampled, top_keys, distinct_keys "
                    "FROM analysis_partition_load WHERE run_id = %s", (run_id,))
        partitions = {(row[0], row[1]): row[2:] for row in cur.fetchall()}
        for table in ("analysis_partition_load", "analysis_skew", "analysis_partition_buckets"):
            cur.execute(f"DELETE FROM {table} WHERE run_id = %s", (run_id,))
    return json.loads(output.read_text()), skew, partitions


def test_each_topic_gets_its_cause(topics, analysed) -> None:
    names, _, _ = topics
    document, stored, _ = analysed
    diagnosed = {s["topic"]: s["diagnosis"] for s in document["skew"]}
    assert {cause: diagnosed[topic]["cause"] for cause, topic in names.items()} == {
        cause: cause for cause in names}
    assert {topic: cause for topic, (cause, _) in stored.items()} == {t: c for c, t in names.items()}
    for topic, (_, recommendation) in stored.items():
        assert recommendation == diagnosed[topic]["recommendation"] and recommendation
    sized = diagnosed[names["too_few_partitions"]]
    assert sized["figures"]["sizing_partitions"] == SIZED_PARTITIONS > PARTITIONS
    assert f"{SIZED_PARTITIONS} partitions" in sized["recommendation"]


def test_the_hot_keys_share_is_within_a_point_of_the_share_by_hand(topics, analysed) -> None:
    names, hot_key, share = topics
    document, _, stored = analysed
    (skew,) = [s for s in document["skew"] if s["topic"] == names["hot_key"]]
    top = skew["diagnosis"]["figures"]["top_key"]
    assert top["key"] == hot_key and hot_key in skew["diagnosis"]["recommendation"]
    assert abs(top["topic_share"] - share) < 0.01, (top, share)
    hottest = skew["hottest_partition"]
    records, keyless, sampled, top_keys, distinct = stored[(names["hot_key"], hottest)]
    # sampled, not read whole: the partition holds about 6,000 records, the sample about 3,300
    assert key_sample_size()["records"] <= sampled < records and keyless == 0 and distinct is None
    assert top_keys[0]["key"] == hot_key and abs(top_keys[0]["share"] * records / RECORDS - share) < 0.01
    assert top_keys[0]["share_error"] < 0.03


def test_keyless_records_are_counted_whole(topics, analysed) -> None:
    names, _, _ = topics
    document, _, stored = analysed
    sticky = {p: row for (topic, p), row in stored.items() if topic == names["keyless_sticky"]}
    assert sum(row[0] for row in sticky.values()) == 4000
    assert all(records == keyless for records, keyless, *_ in sticky.values())
    (skew,) = [s for s in document["skew"] if s["topic"] == names["keyless_sticky"]]
    assert skew["diagnosis"]["figures"]["keyless_share"] == 1.0
    assert [s["diagnosis"]["figures"]["keyless_share"] for s in document["skew"]
            if s["topic"] != names["keyless_sticky"]] == [0.0, 0.0, 0.0]
