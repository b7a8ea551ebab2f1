"""A canary's member: flow mode over the partitions the active version's group lends its canary.

It joins no group: it `assign()`s what it borrows (`consumers.canary.loans`) from where the
active owner handed it over, commits under the canary's own group, and hands a partition back
(drained and committed) when asked or when it stops. It keeps what it borrows by renewing a
lease each tick; once it cannot renew for longer than the lease (the database gone, the process
frozen) it lets go of everything unhandled, since the active owner takes a lapsed partition back.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import TopicPartition

from consumers.canary import loans as canary_loans
from consumers.config.events import canary_group
from consumers.runtime.fetch_buffer import FetchBuffer
from consumers.runtime.flow_member import LOAN_TICK_S, FlowMember, log
from consumers.runtime.member import MemberSettings
from consumers.runtime.stages import StageContext


class BorrowerMember(FlowMember):
    """A flow-mode member of canary `canary_id`'s fleet of `borrowers` members."""

    def __init__(self, name: str, settings: MemberSettings, ctx: StageContext, canary_id: int,
                 borrowers: int) -> None:
        super().__init__(name, settings, ctx)
        self.canary_id = canary_id
        self.borrowers = borrowers
        self._lent_at: dict[tuple[str, int], int] = {}
        self._held_until = time.monotonic()  # the lease as this member last renewed it
        self.assigned_once.set()  # ready without partitions: the canary lends them later

    def _join(self) -> None:
        """Nothing to join: partitions come from the loans."""

    def _consumer_config(self) -> dict[str, Any]:
        config = super()._consumer_config()
        config["group.id"] = canary_group(self.settings.group_id, self.canary_id)
        return config

    def _hold_back_lent(self, store: canary_loans.LoanStore, tps: set[tuple[str, int]]) -> None:
        """What it is given it borrowed: nothing to hold back."""

    def _tend_loans(self, store: canary_loans.LoanStore, buffer: FetchBuffer) -> None:
        """Renew the lease, start on newly lent partitions, hand back those asked back, and let go
        of those no longer held (the lease lapsed)."""
        lease_s = self.loan_lease_s
        try:
            held = store.hold(self.settings.group_id, self.topic, self.canary_id, self.name,
                              self.borrowers, lease_s)
        except Exception as exc:  # noqa: BLE001 - a dependency: kept until the lease could lapse
            log.warning("%s: lease on borrowed partitions not renewed (%s)", self.name, exc)
            if time.monotonic() > self._held_until - 2 * LOAN_TICK_S:
                self._let_go(set(self.assignment))
            return
        self._held_until = time.monotonic() + lease_s
        for partition, loan in sorted(held.items()):
            tp = (self.topic, partition)
            if tp not in self.assignment and loan.state == canary_loans.LENT and loan.position is not None:
                self._borrow(tp, loan.position)
            elif tp in self.assignment and loan.state == canary_loans.RETURNING:
                self._release(set([tp]), commit=True)
                self.assignment.discard(tp)
        self._let_go(self.assignment - {(self.topic, p) for p in held})

    def _borrow(self, tp: tuple[str, int], position: int) -> None:
        self._consumer.incremental_assign([TopicPartition(tp[0], tp[1], position)])
        self._tracker.assigned(tp)
        self._lent_at[tp] = position
        self.assignment.add(tp)
        self._assignment_changed = True
        self._record("borrow", [f"{tp[0]}:{tp[1]}@{position}"])

    def _let_go(self, tps: set[tuple[str, int]]) -> None:
        """Stop working on partitions this member no longer holds, committing nothing more."""
        if tps:
            self._release(tps, commit=False)
            self.assignment -= tps

    def _release_partitions(self, tps: set[tuple[str, int]], commit: bool) -> None:
        """Drain and (when `commit`) commit, stop fetching, and hand the partitions back at the
        later of where they were lent and this group's commit."""
        super()._release_partitions(tps, commit)
        mine = [tp for tp in tps if tp in self._lent_at]
        if not mine:
            return
        self._consumer.incremental_unassign([TopicPartition(*tp) for tp in mine])
        store = self.ctx.loans
        for tp in mine:
            lent_at = self._lent_at.pop(tp)
            if not commit or store is None:
                continue
            position = max(lent_at, self._start_of(self._consumer, tp))
            try:
                store.returned(self.settings.group_id, tp[0], tp[1], self.name, position)
                self._record("give_back", [f"{tp[0]}:{tp[1]}@{position}"])
            except Exception as exc:  # noqa: BLE001 - the lease lapses and the owner takes it back
                log.warning("%s: %s:%s not handed back (%s); it returns when the lease lapses",
                            self.name, tp[0], tp[1], exc)
