"""The watcher of the dead-letter topics: one asset event per burst of dead letters, not one per
record, and none lost.

The trigger is the Kafka provider's shared-stream trigger (`KafkaSharedStreamTrigger`), not its
message-queue trigger: the message-queue trigger commits a record's offset before the event it
fires is stored and ends after each event (the triggerer starts it again, a new consumer joining
the group each time), which is how its users see asset events drift from committed offsets. The
shared stream keeps one consumer and commits an offset only once the event derived from that
record is stored in the metadata database; it needs `enable.auto.commit=false`, which is why the
watcher has a connection of its own, `kafka_dead_letter_watch` (the admin's settings plus its own
`group.id`, auto-commit off, `auto.offset.reset=earliest` so a dead-letter topic created before
the watcher saw it is read from its start, and a 10 s metadata refresh so a new run's topic is
seen within 10 s).

**One event per burst**: a dead letter arriving `window_s` or more after the last event opens a
window and fires; the records arriving in that window fire nothing (they are still committed as
the filter moves past them). Fifty dead letters within a second are one event, so one DAG run;
a steady trickle is one run per window. The event is a wake-up and carries nothing: the run
waits until the window is over (plus a margin for the row written after the record) and reads
`dead_letters` from where the previous triage stopped (`pipeline_ops.triage`). So no dead letter
is lost when events are: records swallowed by a window have their rows read by that window's
run; an event lost or merged by the scheduler (Airflow queues at most one pending run per asset
and DAG, and users report events left behind `max_active_runs=1`) leaves its letters to the next
run, which reads them; an event delivered twice after a triggerer restart wakes a run that finds
little or nothing new. A row written after the run read (its writer retrying PostgreSQL for
longer than the margin) is counted by the next triage.

**Which topics**: every run writes its own `<prefix>.dlq` (`consumers.config.events.Topics`), so the
watcher subscribes to a pattern: librdkafka treats a topic name starting with `^` as a regular
expression and follows the topics that match as they are created. The pattern is
`DEAD_LETTER_TOPICS` from the environment of the DAG processor, default every topic ending in
`.dlq`; a deployment (or a test sharing a cluster) narrows it to its own prefix.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator, Sequence
from time import monotonic
from typing import Any

from airflow.providers.apache.kafka.hooks.consume import KafkaConsumerHook
from airflow.providers.apache.kafka.triggers.shared_stream import (
    KafkaBrokerPayload,
    KafkaSharedStreamProducer,
    KafkaSharedStreamTrigger,
)
from airflow.triggers.base import TriggerEvent
from asgiref.sync import sync_to_async

from consumers.config.pipeline_spec import DEAD_LETTER

CONNECTION = "kafka_dead_letter_watch"
TOPICS_ENV = "DEAD_LETTER_TOPICS"
DEFAULT_TOPICS = rf"^.+\.{DEAD_LETTER}$"
WINDOW_S = 10.0
# Between a dead letter's record being acknowledged and its row committed: the runtime writes
# the row right after the acknowledgement.
ROW_MARGIN_S = 5.0
TOPIC_CHECK_S = 10.0  # how often the watcher looks for a first matching topic

log = logging.getLogger(__name__)


def watched_topics() -> str:
    """The topic pattern the watcher subscribes to."""
    return os.environ.get(TOPICS_ENV) or DEFAULT_TOPICS


class BurstWindow:
    """Whether a record opens a new window: the first one does, and then the first one
    `window_s` or more after the window opened."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._opened: float | None = None

    def opens(self, now: float) -> bool:
        if self._opened is not None and now - self._opened < self.window_s:
            return False
        self._opened = now
        return True


def matches(subscription: str, topic: str) -> bool:
    """Whether a topic is one a subscription entry names: a pattern (starting with `^`, as
    librdkafka takes it) or a topic name."""
    if subscription.startswith("^"):
        return re.search(subscription, topic) is not None
    return subscription == topic


class WatchProducer(KafkaSharedStreamProducer):
    """The provider's shared-stream producer, opening its consumer only once a topic matches.

    librdkafka reports a subscription that matches no topic as a consumer error
    (UNKNOWN_TOPIC_OR_PART) and the provider's poll loop ends the stream on any consumer error,
    so on a cluster with no dead-letter topic yet the triggerer would start the watcher again
    every few seconds. Waiting here, before any record was read (nothing to commit), keeps it
    quiet until a run creates the first one. A matched topic deleted later (runs' topics are)
    ends the stream once: the triggerer starts the watcher again, and records it had not
    committed come again, waking one more run at most, which finds little or nothing new."""

    async def open_stream(self) -> AsyncIterator[tuple[Any, KafkaBrokerPayload]]:
        await self._until_a_topic_matches()
        async for item in super().open_stream():
            yield item

    async def _until_a_topic_matches(self) -> None:
        consumer = KafkaConsumerHook(topics=self.topics, kafka_config_id=self.kafka_config_id).get_conn
        try:
            while True:
                metadata = await sync_to_async(consumer.list_topics)(timeout=10)
                if any(matches(s, t) for s in self.topics for t in metadata.topics):
                    return
                log.info("no topic matches %s yet; looking again in %.0f s", self.topics, TOPIC_CHECK_S)
                await asyncio.sleep(TOPIC_CHECK_S)
        finally:
            await sync_to_async(consumer.close)()  # after a list_topics still running, on its thread


class DeadLetterBurstTrigger(KafkaSharedStreamTrigger):
    """`KafkaSharedStreamTrigger` firing once per window of records instead of once per record."""

    def __init__(self, *, topics: Sequence[str], kafka_config_id: str = CONNECTION, poll_timeout: float = 1.0,
                 window_s: float = WINDOW_S) -> None:
        super().__init__(topics=topics, kafka_config_id=kafka_config_id, poll_timeout=poll_timeout)
        self.window_s = window_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.{type(self).__qualname__}",
                {"topics": self.topics, "kafka_config_id": self.kafka_config_id,
                 "poll_timeout": self.poll_timeout, "window_s": self.window_s})

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> WatchProducer:
        return WatchProducer(topics=kwargs["topics"], kafka_config_id=kwargs["kafka_config_id"],
                             poll_timeout=kwargs["poll_timeout"])

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """One event for the record that opens a window. The event is yielded before the next
        record is pulled, so the record's offset is committed only once the event is stored."""
        window = BurstWindow(self.window_s)
        async for _ in shared_stream:
            if window.opens(monotonic()):
                yield TriggerEvent({"window_s": self.window_s})


def trigger() -> DeadLetterBurstTrigger:
    """The watcher's trigger on the configured topics."""
    return DeadLetterBurstTrigger(topics=[watched_topics()])
