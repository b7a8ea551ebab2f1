"""A consumer-group member in baseline or bounded mode: consume a batch, process it, commit.

baseline  consume up to 500 records, process them one by one, commit after the batch: the
          client defaults of the reference article, which get expelled when a batch outlasts
          `max.poll.interval.ms`.
bounded   consume `batch_size` records sized so a batch always finishes well inside
          `max.poll.interval.ms`, process, commit: one request in flight per member.

A record whose dependency failed is sought back and its partition waits, with backoff, while
the loop polls on (`consumers.runtime.member` says what is committed when).
"""

from __future__ import annotations

import threading

from confluent_kafka import Message, TopicPartition

from consumers.kafka_clients import records
from consumers.runtime import failures, metrics
from consumers.runtime.group_member import GroupMember
from consumers.runtime.member import TRANSIENT_BACKOFF_S, MemberSettings
from consumers.runtime.stages import RecordState, StageContext

BASELINE_BATCH = 500  # the Java client's max.poll.records default


class BatchMember(GroupMember):
    """A consumer-group member running one stage in baseline or bounded mode."""

    def __init__(self, name: str, settings: MemberSettings, ctx: StageContext) -> None:
        super().__init__(name, settings, ctx)
        # the state of records sought back after a transient failure, and positions handled
        # whose commit failed (retried with the next batch's, unless revoked)
        self._retrying: dict[tuple[str, int, int], RecordState] = {}
        self._uncommitted: dict[tuple[str, int], int] = {}

    def _loop(self, stop: threading.Event) -> None:
        size = BASELINE_BATCH if self.settings.mode == "baseline" else self.settings.batch_size
        backoff = 0.0
        while not stop.is_set():
            processed: dict[tuple[str, int], int] = {}
            waiting: set[tuple[str, int]] = set()

            def process(msg: Message, processed: dict = processed, waiting: set = waiting) -> None:
                topic, partition, offset = records.place(msg)
                tp = (topic, partition)
                if stop.is_set() or tp in waiting:
                    return  # shutting down, or behind a record that waits: not committed
                key = (topic, partition, offset)
                state = self._retrying.pop(key, None) or RecordState()
                metrics.IN_FLIGHT.labels(**self.labels).set(1)
                try:
                    self._process(msg, state)
                except Exception as exc:
                    if failures.classify(exc).kind != failures.TRANSIENT:
                        raise
                    self._transient(msg, exc)
                    self._retrying[key] = state
                    waiting.add(tp)
                    self._consumer.seek(TopicPartition(topic, partition, offset))
                    return
                finally:
                    metrics.IN_FLIGHT.labels(**self.labels).set(0)
                processed[tp] = offset + 1

            self._accept(self._consumer.consume(num_messages=size, timeout=0.2), process)
            self._uncommitted.update(processed)
            if self._commit(self._uncommitted):
                self._uncommitted.clear()
            if waiting:
                backoff = min(max(2 * backoff, TRANSIENT_BACKOFF_S), self.settings.transient_backoff_max_s)
                stop.wait(backoff)
            else:
                backoff = 0.0

    def _release_partitions(self, tps: set[tuple[str, int]], commit: bool) -> None:
        """Stop the partitions' retries and forget what they had not committed."""
        for key in [k for k in self._retrying if k[:2] in tps]:
            del self._retrying[key]
        for tp in tps & self._uncommitted.keys():
            del self._uncommitted[tp]
