"""Bad input on every stage's input topic is dead-lettered and the partitions move on.

The corpus (tests/bad_input.py) goes to the intake, style and generate topics of one pipeline
(intake consumed in bounded mode, check in flow mode, generate in bounded mode with two
members), followed by valid requests. Every bad record must reach `<prefix>.dlq` with its reason
and origin, and the `dead_letters` table; the valid requests must complete after it; no member
may fail; the groups' committed offsets must reach the end of every input partition.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer

from bench.figures import read_to_end
from consumers.config import events
from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.config.kafka_connection import KafkaConnection
from consumers.runs.pipeline_run import running_pipeline
from consumers.runtime import dead_letter
from tests.bad_input import OVER_PRODUCER_LIMIT_BYTES, BadInput, corpus
from tests.integration.kafka_helpers import records_of, wait_committed_to_end
from tests.integration.pipeline_fixtures import REBALANCE_TIME_SCALE, AIService, ai_service, query
from tests.stack import Stack

PARTITIONS = 2
VALID = 24  # uuid keys: every partition of every input topic gets some (P(miss) ~ 1e-7)
# Sends the corpus: raised above the 1,020,000-byte case, under the broker's 1,048,588 per batch.
CORPUS_PRODUCER = {"acks": "all", "compression.type": "none", "linger.ms": 0,
                   "message.max.bytes": 1_048_576}


@pytest.fixture(scope="module")
def ai() -> Iterator[AIService]:
    with ai_service() as service:
        yield service


@dataclass(frozen=True)
class Sent:
    """A corpus record and where the broker put it."""

    stage: str
    topic: str
    partition: int
    offset: int
    case: BadInput

    @property
    def origin(self) -> tuple[str, int, int]:
        return self.topic, self.partition, self.offset


@dataclass(frozen=True)
class DeadLetter:
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes | None]]

    def header(self, name: str) -> bytes | None:
        return next((v for n, v in self.headers if n == name), None)

    @property
    def origin(self) -> tuple[str, int, int]:
        return (self.header("source_topic").decode(), int(self.header("source_partition")),
                int(self.header("source_offset")))


def send_one(producer: Producer, topic: str, partition: int, case: BadInput) -> Message:
    """Send one record as it is (a null value too) and wait for its acknowledgement."""
    reports: list[tuple[KafkaError | None, Message]] = []
    producer.produce(topic, value=case.value, key=case.key, headers=case.headers, partition=partition,
                     on_delivery=lambda err, msg: reports.append((err, msg)))
    assert producer.flush(30) == 0, f"{case.name} not delivered"
    [(err, msg)] = reports
    assert err is None, f"{case.name}: {err}"
    return msg


def produce_corpus(kafka: KafkaConnection, topics: events.Topics) -> list[Sent]:
    """Each stage's corpus on its input topic, spread over the partitions, one ack at a time."""
    producer = Producer(kafka.client(**CORPUS_PRODUCER))
    sent: list[Sent] = []
    for stage in topics.spec.stages:
        topic = topics.source_of(stage)
        for i, case in enumerate(corpus(topics.spec, stage)):
            msg = send_one(producer, topic, i % PARTITIONS, case)
            sent.append(Sent(stage, topic, msg.partition(), msg.offset(), case))
    return sent


def read_topic(kafka: KafkaConnection, topic: str) -> list[DeadLetter]:
    """Every record of `topic`, as a `read_committed` reader finds it."""
    reader = Consumer(kafka.client(**{"group.id": f"read-{topic}", "enable.auto.commit": False,
                                      "isolation.level": "read_committed"}))
    try:
        return [DeadLetter(m.value(), m.key(), m.headers() or []) for m in read_to_end(reader, topic)]
    finally:
        reader.close()


# Each shipped pipeline; the reference one with each consumer mode on some stage.
MIXED_MODES = {"intake": StageConfig("bounded", members=1, batch_size=4),
               "check": StageConfig("flow", members=1, window=8),
               "generate": StageConfig("bounded", members=2, batch_size=2)}
PIPELINES = [("genai_image", MIXED_MODES), ("text_moderation", {})]


@pytest.mark.parametrize(("pipeline_name", "stages"), PIPELINES, ids=[p for p, _ in PIPELINES])
def test_bad_input_on_every_input_topic_is_dead_lettered(stack: Stack, ai: AIService, pipeline_name: str,
                                                         stages: dict[str, StageConfig]) -> None:
    config = PipelineConfig(pipeline=pipeline_name, partitions=PARTITIONS, time_scale=REBALANCE_TIME_SCALE,
                            replication_factor=1, stages=stages)
    with running_pipeline(config, stack.kafka, stack.database_url,
                          ai.endpoints_of(pipeline_name)) as pipeline:
        topics = pipeline.topics
        sent = produce_corpus(stack.connection, topics)
        pipeline.send(VALID)
        counts = pipeline.wait_terminal(VALID, timeout_s=120)
        groups = {topics.source_of(stage): f"{topics.prefix}.{stage}" for stage in topics.spec.stages}
        offsets = wait_committed_to_end(stack.connection, groups, timeout_s=60)
        written = {topic: records_of(stack.connection, topic) for topic in groups}
        dead = read_topic(stack.connection, topics.dead_letter)
        alive = {t.name for t in threading.enumerate()}
        for fleet in pipeline.fleets.values():
            fleet.raise_failures()
            assert {m.name for m in fleet.members} <= alive, f"a {fleet.settings.member.stage} member died"
        expelled = query(stack.database_url, "SELECT member, event FROM rebalance_events WHERE run_id = %s "
                         "AND event IN ('lost', 'max_poll_exceeded')", pipeline.run_id)

    # The corpus was produced: every case of every stage, on both partitions of each topic.
    per_stage = {stage: len(corpus(topics.spec, stage)) for stage in topics.spec.stages}
    assert len(sent) == sum(per_stage.values()) == len(topics.spec.stages) * 31
    assert {(s.topic, s.partition) for s in sent} == {(t, p) for t in groups for p in range(PARTITIONS)}
    assert len({s.origin for s in sent}) == len(sent)

    # Valid requests completed, no member was expelled, and the groups committed to the end.
    assert counts == {"completed": VALID}, counts
    assert expelled == []
    for topic, (committed, left) in offsets.items():
        assert left == 0, (topic, committed, left)
        stage = next(s for s in topics.spec.stages if topics.source_of(s) == topic)
        # a valid request reaches each stage once (none is rejected), the join twice: one
        # event per model's answer
        arrivals = 2 if (pipeline_name, stage) == ("text_moderation", "join") else 1
        assert written[topic] == per_stage[stage] + arrivals * VALID, (topic, written[topic])

    # Every corpus record is on the dead-letter topic once, with its reason and origin.
    expected = {s.origin: s for s in sent}
    assert len(dead) == len(sent), f"{len(dead)} dead letters for {len(sent)} bad records"
    by_origin = {d.origin: d for d in dead}
    assert by_origin.keys() == expected.keys()
    for origin, s in expected.items():
        d, case = by_origin[origin], s.case
        where = f"{s.stage}/{case.name}"
        assert d.header("reason") == case.reason.encode(), (where, d.header("reason"), d.header("detail"))
        assert d.header("stage") == s.stage.encode(), where
        assert len(d.header("detail")) <= dead_letter.DETAIL_MAX_BYTES
        d.header("detail").decode()  # valid UTF-8
        original = dead_letter.record_size(case.value, case.key, case.headers or [])
        assert d.header("original_size") == str(original).encode(), where
        if case.name == "over_producer_limit":
            assert d.header("by_reference") == b"true", where
            assert d.header("original_value_size") == str(OVER_PRODUCER_LIMIT_BYTES).encode()
            assert (d.value, d.key) == (case.value[:dead_letter.VALUE_PREFIX_BYTES], None)
        else:
            assert d.header("by_reference") is None, where
            # KeyedProducer sends no null value: a null record's dead letter has an empty one.
            assert (d.value, d.key) == (case.value or b"", case.key), where
            copied = [(n.removeprefix(dead_letter.SOURCE_HEADER_PREFIX), v) for n, v in d.headers
                      if n.startswith(dead_letter.SOURCE_HEADER_PREFIX)]
            assert copied == (case.headers or []), where

    # ... and in the dead_letters table, with a bounded payload.
    rows = query(stack.database_url, "SELECT source_topic, kafka_partition, kafka_offset, stage, "
                 "split_part(reason, ':', 1), request_id, payload FROM dead_letters WHERE run_id = %s",
                 pipeline.run_id)
    assert len(rows) == len(sent)
    stored = {(t, p, o): (stage, reason, request_id, None if payload is None else bytes(payload))
              for t, p, o, stage, reason, request_id, payload in rows}
    assert stored == {origin: (s.stage, s.case.reason, None, dead_letter.stored_payload(s.case.value))
                      for origin, s in expected.items()}

    # The partitions moved on: each input partition has a valid result after its last bad record.
    last_bad: dict[tuple[str, int], int] = {}
    for s in sent:
        last_bad[(s.topic, s.partition)] = max(s.offset, last_bad.get((s.topic, s.partition), -1))
    results = query(stack.database_url, "SELECT topic, kafka_partition, max(kafka_offset) FROM "
                    "stage_results WHERE run_id = %s GROUP BY 1, 2", pipeline.run_id)
    last_valid = {(t, p): o for t, p, o in results}
    for tp, offset in last_bad.items():
        assert last_valid.get(tp, -1) > offset, (tp, offset, last_valid.get(tp))
