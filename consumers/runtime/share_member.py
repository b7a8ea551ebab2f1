"""One member of a stage's share group (KIP-932, "queues for Kafka"): the broker hands records
to members one by one, so a stage can run more members than its topic has partitions.

confluent-kafka marks its `ShareConsumer` as preview, and the member is shaped by what that
client allows. Only explicit acknowledgement lets the member say how each record ended (the
implicit mode accepts a whole batch on the next poll); in that mode `poll()` refuses to run
until every record of the previous batch is acknowledged, acknowledgements are only taken from
the polling thread, and the broker's lock on a delivered record (`share.record.lock.duration.ms`)
cannot be renewed. So the member works in batches: it polls up to `window` records
(`max.poll.records`, the member's share of the AI concurrency; the broker may round it up to a
whole producer batch), handles them at once on `window` workers, acknowledges each from the
polling thread, and polls again, which sends the acknowledgements. A batch of `window` records
takes about one AI call, far inside the lock.

How each record is acknowledged:

- ACCEPT once handled; REJECT once dead-lettered because it is its own fault
  (`consumers.runtime.failures`), through the same path as the other modes (topic and table);
- a dependency's failure is retried in the worker during the first half of the lock, counted
  from the poll; the record is then RELEASEd and delivered again, to this member or another;
- on the broker's last delivery (`group.share.delivery.count.limit`) the broker would archive a
  released record without a trace, so one still failing is dead-lettered with reason
  `delivery_limit` and REJECTed;
- any other failure releases the record and takes the member down, like the flow mode.

The group starts at the earliest record only if told before its first fetch, so each member
sets the group's configs before it subscribes. The client has no rebalance callbacks; its
statistics say whether the member holds partitions (not which), and that is what counts as
assigned. At most one AI call per request still comes from the stage claims: a record whose
lock ran out while it was being handled is delivered again, and its second copy waits for the
first one's result.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import AcknowledgeType, KafkaException, Message, ShareConsumer, TopicPartition

from consumers.config import profiles
from consumers.kafka_clients import provisioning, records
from consumers.runtime import metrics
from consumers.runtime.member import MemberSettings, StageMember, stats_summary
from consumers.runtime.stages import RecordState, StageContext

log = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.2
ASSIGNMENT_PROBE_MS = 500  # statistics interval when none is configured: how assignment is seen
LOCK_SHARE_FOR_RETRIES = 0.5  # of the record lock: the rest covers the try under way at its end
DELIVERY_LIMIT = "delivery_limit"


class ShareMember(StageMember):
    """A share-group member running one stage: poll a batch, handle it, acknowledge it."""

    def __init__(self, name: str, settings: MemberSettings, ctx: StageContext) -> None:
        super().__init__(name, settings, ctx)
        self._consumer: ShareConsumer  # made by _run, which runs everything else
        self._holds_partitions = False
        self._lock_s = profiles.share_record_lock_ms(settings.time_scale) / 1000

    def _run(self, stop: threading.Event) -> None:
        s = self.settings
        provisioning.configure_share_group(s.kafka, s.group_id, s.time_scale)
        config = s.kafka_config()
        config["client.id"] = self.name
        config.setdefault("statistics.interval.ms", ASSIGNMENT_PROBE_MS)
        config["stats_cb"] = self._on_stats
        self._consumer = ShareConsumer(config)
        try:
            self._consumer.set_acknowledgement_commit_callback(self._on_acknowledged)
            self._consumer.subscribe([self.topic])
            with ThreadPoolExecutor(max_workers=s.window, thread_name_prefix=f"{self.name}-w") as pool:
                while not stop.is_set():
                    polled_at = time.monotonic()
                    batch: list[Message] = []
                    self._accept(self._consumer.poll(POLL_TIMEOUT_S), batch.append)
                    if batch:
                        self._handle(pool, batch, polled_at + LOCK_SHARE_FOR_RETRIES * self._lock_s, stop)
                    self._store_group_events()
        finally:
            self._consumer.close()  # sends the last acknowledgements and leaves the group
            self._closed()

    def _handle(self, pool: ThreadPoolExecutor, batch: list[Message], retry_until: float,
                stop: threading.Event) -> None:
        """Handle the batch on the workers, then acknowledge each record from this thread."""
        failed = threading.Event()  # a failure no rule covers: the other workers stop retrying
        metrics.IN_FLIGHT.labels(**self.labels).set(len(batch))
        futures = [pool.submit(self._work, msg, retry_until, stop, failed) for msg in batch]
        fatal: tuple[Message, BaseException] | None = None
        for msg, future in zip(batch, futures, strict=True):
            try:
                ack = future.result()
            except Exception as exc:  # noqa: BLE001 - raised below, once the batch is acknowledged
                fatal = fatal or (msg, exc)
                ack = AcknowledgeType.RELEASE
            self._consumer.acknowledge(msg, ack)
        metrics.IN_FLIGHT.labels(**self.labels).set(0)
        if fatal is not None:
            msg, failure = fatal
            raise RuntimeError(f"{self.name}: {msg.topic()}:{msg.partition()}@{msg.offset()} failed in a "
                               "way no retry or dead letter fits; it was released, not accepted") from failure

    def _work(self, msg: Message, retry_until: float, stop: threading.Event,
              failed: threading.Event) -> AcknowledgeType:
        """Worker: how the record is to be acknowledged, once handled as far as the lock allows."""
        state = RecordState()

        def halted() -> bool:
            return stop.is_set() or failed.is_set()

        try:
            completed = self._retry(msg, lambda: self._process(msg, state),
                                    lambda: not halted() and time.monotonic() < retry_until)
            if completed is not None:
                return AcknowledgeType.ACCEPT if completed else AcknowledgeType.REJECT
            if records.delivery_count(msg) < profiles.SHARE_DELIVERY_COUNT_LIMIT:
                return AcknowledgeType.RELEASE
            return self._last_delivery(msg, state, halted)
        except Exception:
            failed.set()
            raise

    def _last_delivery(self, msg: Message, state: RecordState, halted: Callable[[], bool]) -> AcknowledgeType:
        """Dead-letter a record that still waits on a dependency at its last delivery, retrying
        past the lock if need be (the dead letter keeps it either way), and REJECT it."""
        detail = (f"a dependency still failed at delivery {msg.delivery_count()} of "
                  f"{profiles.SHARE_DELIVERY_COUNT_LIMIT}")

        def dead_letter() -> bool:
            self._dead_letter(msg, self._origin(msg), self._event(msg), DELIVERY_LIMIT, detail, state)
            return True

        if self._retry(msg, dead_letter, lambda: not halted()):
            return AcknowledgeType.REJECT
        log.error("%s: %s:%d@%d had its last delivery and could not be dead-lettered before the member "
                  "stopped: the broker archives it", self.name, msg.topic(), msg.partition(), msg.offset())
        return AcknowledgeType.RELEASE

    def _on_stats(self, raw: str) -> None:
        summary = stats_summary(raw)
        self._follow_assignment(summary["assignment_size"])
        if self.settings.stats_interval_ms:
            self._keep_stats(summary)

    def _follow_assignment(self, size: int) -> None:
        """Record gaining or losing partitions as the group events the platform reads."""
        if (size > 0) != self._holds_partitions:
            self._holds_partitions = size > 0
            self._record("assign" if self._holds_partitions else "revoke", [])
            if self._holds_partitions:
                self.assigned_once.set()

    def _on_acknowledged(self, offsets: dict[TopicPartition, set[int]], error: KafkaException | None) -> None:
        """A refused acknowledgement means the record's lock ran out first: it is delivered
        again, and handling it again is idempotent."""
        if error is not None:
            log.warning("%s: acknowledgements refused for %s: %s", self.name,
                        {f"{tp.topic}:{tp.partition}": sorted(o) for tp, o in offsets.items()}, error)
