"""A member of a stage's consumer group: its client, its group events and its commits.

What the batch member (`consumers.runtime.batch_member`: baseline and bounded modes) and the flow
member (`consumers.runtime.flow_member`) share: the consumer and its subscription, the
member's own transactional producer when outputs go exactly once, the assignment as the client
reports it, and committing positions. Each mode supplies its loop (`_loop`) and what handing
partitions back means for its own state (`_release_partitions`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from consumers.config import profiles
from consumers.config.profiles import transactional_id
from consumers.runtime.member import MemberSettings, StageMember
from consumers.runtime.outbox import TransactionalOutbox
from consumers.runtime.stages import StageContext

log = logging.getLogger(__name__)


def _names(partitions: list[TopicPartition]) -> list[str]:
    return [f"{p.topic}:{p.partition}" for p in partitions]


class GroupMember(StageMember):
    """A consumer-group member running one stage; its mode's subclass runs the loop."""

    def __init__(self, name: str, settings: MemberSettings, ctx: StageContext) -> None:
        super().__init__(name, settings, ctx)
        self._consumer: Consumer  # made by _run, which runs everything else
        self._transactions: TransactionalOutbox | None = None  # exactly once: the member's own

    # ----------------------------------------------------------------- lifecycle
    def _run(self, stop: threading.Event) -> None:
        if self.settings.exactly_once:
            self._transactions = self._transactional_outbox()
            self.ctx = replace(self.ctx, outbox=self._transactions)
        self._consumer = Consumer(self._consumer_config())
        self._join()
        try:
            self._loop(stop)
        finally:
            self._consumer.close()  # leaves the group; triggers a final revoke
            if self._transactions is not None:
                self._transactions.close()
            self._closed()

    def _join(self) -> None:
        """Subscribe: the group hands out the partitions."""
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_lost)

    def _consumer_config(self) -> dict[str, Any]:
        config = self.settings.kafka_config()
        config["client.id"] = self.name
        if self.settings.stats_interval_ms:
            config["stats_cb"] = self._on_stats
        return config

    def _loop(self, stop: threading.Event) -> None:
        """Consume until `stop`, the mode's way."""
        raise NotImplementedError

    def _transactional_outbox(self) -> TransactionalOutbox:
        """The member's own transactional producer. Its id outlives the process, so a restarted
        member fences the one that died, whose open transaction is aborted at once instead of
        holding `read_committed` readers of its outputs until the transaction timeout."""
        s = self.settings
        return TransactionalOutbox(s.kafka, s.profile, transactional_id(s.group_id, self.name),
                                   self.ctx.storage.mark_notified,
                                   transaction_timeout_ms=profiles.TRANSACTION_TIMEOUT_MS,
                                   call_budget_s=s.commit_budget_s, batch_records=s.producer_batch_records)

    # ----------------------------------------------------------------- group events
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assigned = {(p.topic, p.partition) for p in partitions}
        self._assigned(assigned)
        self.assignment |= assigned
        self._record("assign", _names(partitions))
        self.assigned_once.set()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {(p.topic, p.partition) for p in partitions}
        self._record("revoke", _names(partitions))
        self._release(revoked, commit=True)
        self.assignment -= revoked

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = {(p.topic, p.partition) for p in partitions}
        self._record("lost", _names(partitions))
        self._release(lost, commit=False)
        self.assignment -= lost

    def _assigned(self, tps: set[tuple[str, int]]) -> None:
        """Partitions the group just gave this member, before they count in its assignment."""

    def _release(self, tps: set[tuple[str, int]], commit: bool) -> None:
        """Hand partitions back: the mode's own state first (committing what was handled, if
        `commit`), then their outputs waiting for the member's transaction."""
        self._release_partitions(tps, commit)
        if self._transactions is not None:
            self._transactions.drop(tps)

    def _release_partitions(self, tps: set[tuple[str, int]], commit: bool) -> None:
        raise NotImplementedError

    # ----------------------------------------------------------------- commits
    def _commit(self, positions: dict[tuple[str, int], int], asynchronous: bool = False) -> bool:
        """Commit `positions` (with the outputs of the records below them, exactly once);
        asynchronously, True only says the request was queued."""
        if not positions:
            return True
        if self._transactions is not None:
            return self._transactions.commit(positions, self._consumer)
        try:
            # The client's stubs overload `commit` on a literal `asynchronous` only.
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()],  # type: ignore[call-overload]
                                  asynchronous=asynchronous)
            return True
        except KafkaException as exc:
            # After an expulsion the generation is gone: the records will be consumed again.
            log.warning("%s: commit of %s failed: %s", self.name, positions, exc)
            return False
