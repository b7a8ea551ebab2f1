"""The load source fails, loudly, on any record of its own it could not deliver, on every topic
it writes, and when its flush leaves records undelivered: a loss of the source's is not the
pipeline's to show."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from consumers.config import events, pipeline_spec
from consumers.kafka_clients.producer import DeliveryError
from consumers.loadgen.source import send_requests

TOPICS = events.Topics("src", pipeline_spec.load(pipeline_spec.REFERENCE))
MEASURED = TOPICS.name(TOPICS.spec.load.measure)


class Producer:
    """Acknowledges every send, but for those of `failing` (refused) and `unsent` (still queued
    when the flush gives up: their futures never resolve)."""

    def __init__(self, failing: str = "", unsent: str = "") -> None:
        self.failing, self.unsent = failing, unsent
        self.queued = 0

    def send(self, topic: str, event: dict[str, Any]) -> Future:
        future: Future = Future()
        if topic == self.failing:
            future.set_exception(DeliveryError(f"delivery to {topic} failed: Topic authorization failed"))
        elif topic == self.unsent:
            self.queued += 1
        else:
            future.set_result((0, 0))
        return future

    def flush(self, timeout_s: float = 30.0) -> int:
        return self.queued


def unmeasured_topic() -> str:
    (topic,) = [t for t in TOPICS.producing() if t != MEASURED]
    return topic


def test_a_refused_delivery_on_a_topic_it_does_not_measure_fails_the_source() -> None:
    with pytest.raises(DeliveryError, match="authorization"):
        send_requests(Producer(failing=unmeasured_topic()), TOPICS, "r1", 5, progress=False)


def test_records_left_undelivered_by_the_flush_fail_the_source() -> None:
    with pytest.raises(DeliveryError, match=r"5 .*undelivered"):
        send_requests(Producer(unsent=unmeasured_topic()), TOPICS, "r1", 5, progress=False)


def test_a_source_whose_every_record_was_acknowledged_reports_where_they_went() -> None:
    report = send_requests(Producer(), TOPICS, "r1", 5, progress=False)
    assert len(report.request_ids) == 5 and report.partitions_measured == [0] * 5
