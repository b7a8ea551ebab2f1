"""Delivery guarantees against the real broker, PostgreSQL and the AI stand-in over HTTP:
copies of one request call each AI once, and a database outage is waited out, not
dead-lettered."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition

from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.config.kafka_connection import KafkaConnection
from consumers.kafka_clients.producer import KeyedProducer
from consumers.runs.pipeline_run import running_pipeline
from consumers.runtime import metrics
from infra import postgres_server
from tests.integration.kafka_helpers import wait_committed_to_end
from tests.integration.pipeline_fixtures import TIME_SCALE, AIService, ai_service, query, scalar
from tests.stack import Stack


@pytest.fixture(scope="module")
def ai() -> Iterator[AIService]:
    with ai_service() as service:
        yield service


def dead_letter_topic_records(kafka: KafkaConnection, topic: str) -> int:
    consumer = Consumer(kafka.client(**{"group.id": f"probe-{uuid.uuid4().hex}"}))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in partitions)
    finally:
        consumer.close()


def waited(reason: str) -> float:
    """Tries that met a failing dependency, counted by this process's fleets."""
    return sum(sample.value for family in metrics.WAITING.collect() for sample in family.samples
               if sample.name.endswith("_total") and sample.labels["reason"] == reason)


def test_copies_of_a_request_sent_back_to_back_call_each_ai_once(stack: Stack, ai: AIService) -> None:
    requests = 20
    config = PipelineConfig(partitions=4, time_scale=TIME_SCALE, replication_factor=1,
                            stages={"check": StageConfig("flow", members=1, window=16),
                                    "generate": StageConfig("flow", members=1, window=16)})
    ai.reset()
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints,
                          stages=("check", "generate")) as pipeline:
        producer = KeyedProducer(stack.connection, key_strategy="uuid")
        ids = [str(uuid.uuid4()) for _ in range(requests)]
        for request_id in ids:
            event = {"request_id": request_id, "run_id": pipeline.run_id, "style": "minimal",
                     "description": "a poster", "produced_at": time.time()}
            for _ in range(2):  # the same event twice, on different partitions (fresh UUID keys)
                producer.send(pipeline.topics.name("style"), event)
        producer.close()
        # every copy handled: its result stored, or skipped, and its offset committed
        topics = pipeline.topics
        handled = wait_committed_to_end(stack.connection, {topics.source_of(s): topics.group_of(s)
                                                           for s in ("check", "generate")}, 60)
    assert all(left == 0 for _, left in handled.values()), handled
    stats = ai.stats()
    assert stats["check"]["served"] == requests  # the service's own count: one call per request
    assert stats["generate"]["served"] == requests
    calls = dict(query(stack.database_url, "SELECT stage, count(*) FROM ai_attempts WHERE run_id = %s "
                       "AND outcome = 'ok' GROUP BY stage", pipeline.run_id))
    assert calls == {"check": requests, "generate": requests}
    skipped = dict(query(stack.database_url, "SELECT stage, count(*) FROM ai_attempts WHERE run_id = %s "
                         "AND outcome = 'skipped_done' GROUP BY stage", pipeline.run_id))
    assert skipped["check"] == requests  # every second copy saw the result and did not call


@pytest.mark.serial  # stops the stack's PostgreSQL: with no other test running
def test_a_database_outage_is_waited_out_and_nothing_is_dead_lettered(stack: Stack, ai: AIService) -> None:
    count, rate, outage_s = 240, 30.0, 6.0
    config = PipelineConfig(partitions=4, time_scale=TIME_SCALE, replication_factor=1,
                            stages={"check": StageConfig("flow", members=1, window=16),
                                    "generate": StageConfig("flow", members=2, window=8)})
    ai.reset()
    waited_before = waited("database_unavailable")
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints) as pipeline:
        sender = threading.Thread(target=pipeline.send, args=(count,), kwargs={"rate": rate})
        sender.start()
        time.sleep(2.0)  # the load is flowing
        postgres_server.stop(stack.layout)
        stopped_at = time.time()
        try:
            time.sleep(outage_s)
        finally:
            postgres_server.start(stack.layout)
        restarted_at = time.time()
        sender.join()
        counts = pipeline.wait_terminal(count, timeout_s=120)
    assert restarted_at - stopped_at >= outage_s
    assert waited("database_unavailable") > waited_before, "no record met the outage: proves nothing"
    assert counts.get("completed", 0) + counts.get("rejected", 0) == count, counts
    assert scalar(stack.database_url, "SELECT count(*) FROM dead_letters WHERE run_id = %s",
                  pipeline.run_id) == 0
    assert dead_letter_topic_records(stack.connection, pipeline.topics.dead_letter) == 0
    produced_during = scalar(stack.database_url, "SELECT count(*) FROM requests WHERE run_id = %s AND "
                             "produced_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
                             pipeline.run_id, stopped_at, restarted_at)
    assert produced_during > 0, "no request was produced during the outage"
    duplicates = scalar(stack.database_url, "SELECT count(*) - count(DISTINCT (request_id, stage)) "
                        "FROM ai_attempts WHERE run_id = %s AND outcome IN ('ok', 'started')",
                        pipeline.run_id)
    assert duplicates == 0
