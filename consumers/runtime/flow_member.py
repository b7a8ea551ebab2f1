"""A consumer-group member in flow mode: polling decoupled from processing.

Records go to an application buffer (`FetchBuffer`: coarse pause/resume with hysteresis) and run
on a pool of `window` workers (the member's share of the AI concurrency); offsets are committed
at the highest contiguous completed position, asynchronously (the poll loop does not wait). On
revocation it finishes (or, past a deadline, abandons) the revoked partitions' work and commits,
waiting for it, before letting them go. A record whose dependency failed is retried in its
worker, whose slot stays taken (`consumers.runtime.member` says what is committed when).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from consumers.canary import loans as canary_loans
from consumers.config.events import canary_group
from consumers.kafka_clients import records
from consumers.runtime import metrics
from consumers.runtime.fetch_buffer import FetchBuffer
from consumers.runtime.group_member import GroupMember
from consumers.runtime.member import MemberSettings
from consumers.runtime.offsets import OffsetTracker
from consumers.runtime.stages import RecordState, StageContext

log = logging.getLogger(__name__)


LOAN_TICK_S = 1.0  # how often a member looks at its partitions' loans to a canary
LOAN_LEASE_TICKS = 4  # the fewest ticks a loan's lease lasts


def _tp(msg: Message) -> tuple[str, int]:
    return records.place(msg)[:2]


class FlowMember(GroupMember):
    """A consumer-group member running one stage in flow mode."""

    def __init__(self, name: str, settings: MemberSettings, ctx: StageContext) -> None:
        super().__init__(name, settings, ctx)
        self._buffer: FetchBuffer | None = None
        self._done: queue.SimpleQueue[_Done] = queue.SimpleQueue()
        self._tracker = OffsetTracker()
        self._assignment_changed = False
        self._fatal: tuple[str, Exception] | None = None  # a worker failure that ends the member
        self._lent: set[tuple[str, int]] = set()  # assigned by the group, lent to a canary: held back

    def _consumer_config(self) -> dict[str, Any]:
        config = super()._consumer_config()
        if self._transactions is None:
            config["on_commit"] = self._on_commit
        return config

    def _assigned(self, tps: set[tuple[str, int]]) -> None:
        for tp in tps:
            self._tracker.assigned(tp)
        self._assignment_changed = True
        self._lent -= tps
        if self.ctx.loans is not None:
            self._hold_back_lent(self.ctx.loans, tps)

    def _app_stats(self) -> dict[str, Any]:
        """Flow mode counts what its buffer took from the client too, and its pause cycles."""
        buffered = self._buffer
        return {"app_consumed_bytes": self.consumed_bytes + (buffered.delivered_bytes if buffered else 0),
                "pause_cycles": buffered.pause_cycles if buffered else 0}

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Flow mode's commits, served inside poll: a position counts as committed once the
        coordinator took it; one it refused stays pending and goes with the next commit."""
        taken = {(p.topic, p.partition): p.offset for p in partitions if err is None and p.error is None}
        self._tracker.mark_committed(taken)
        if len(taken) < len(partitions):
            log.warning("%s: commit refused: %s", self.name,
                        err or [f"{p.topic}:{p.partition}: {p.error}" for p in partitions if p.error])

    # ----------------------------------------------------------------- flow
    def _loop(self, stop: threading.Event) -> None:
        s = self.settings
        poll_interval_s = s.kafka_config()["max.poll.interval.ms"] / 1000
        self._buffer = FetchBuffer(self._consumer, high=s.buffer, keepalive_s=min(1.0, poll_interval_s / 10),
                                   pause_after_s=poll_interval_s / 3)
        last_commit = last_loans = time.monotonic()
        workers = self.ctx.windows.size if self.ctx.windows is not None else s.window
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{self.name}-w") as pool:
            try:
                while not stop.is_set():
                    waiting = len(self._buffer) > 0 and self._free_slots() == 0
                    self._collect_done(block_s=0.02 if waiting else 0)
                    if self._fatal is not None:
                        raise RuntimeError(self._fatal[0]) from self._fatal[1]
                    self._dispatch(pool, self._buffer)
                    if self._assignment_changed:
                        self._buffer.reassert_pause()
                        self._assignment_changed = False
                    timeout = 0 if (len(self._buffer) or self._buffer.paused) else 0.05
                    self._accept(self._buffer.poll(timeout), self._unexpected)
                    metrics.BUFFERED.labels(**self.labels).set(len(self._buffer))
                    metrics.PAUSED.labels(**self.labels).set(int(self._buffer.paused))
                    if time.monotonic() - last_commit >= s.commit_every_s:
                        self._commit_completed(self.assignment, asynchronous=True)
                        self._store_group_events()
                        last_commit = time.monotonic()
                    if self.ctx.loans is not None and time.monotonic() - last_loans >= LOAN_TICK_S:
                        self._tend_loans(self.ctx.loans, self._buffer)
                        last_loans = time.monotonic()
            finally:
                self._shutdown_flow(self._buffer)
        if self._fatal is not None:  # a worker failed while the member was stopping
            raise RuntimeError(self._fatal[0]) from self._fatal[1]

    def _unexpected(self, msg: Message) -> None:
        raise AssertionError(f"FetchBuffer returned a data record: {msg.topic()}:{msg.partition()}")

    def _free_slots(self, take: int = 0) -> int:
        """Records that may start now: room in the window (the fleet's pooled windows, when it
        has several members) and, when the fleet's AI calls follow a limit, no more than the
        limit has spare (the rest wait in the buffer, where its back-pressure applies, rather
        than in a worker). With `take`, up to that many are held in the pool for this member."""
        in_flight = self._tracker.in_flight()
        limiter = self.ctx.ai.limiter if self.ctx.ai is not None else None
        spare = self.settings.window if limiter is None else limiter.spare()
        windows = self.ctx.windows
        if windows is None:
            return min(self.settings.window - in_flight, spare)
        if take:
            return windows.take(self.name, in_flight, min(take, spare))
        return min(windows.free(self.name, in_flight), spare)

    def _dispatch(self, pool: ThreadPoolExecutor, buffer: FetchBuffer) -> None:
        for _ in range(self._free_slots(take=len(buffer))):  # counted once: workers take permits later
            if (msg := buffer.pop()) is None:
                break
            topic, partition, offset = records.place(msg)
            epoch = self._tracker.dispatched((topic, partition), offset)
            pool.submit(self._work, msg, epoch)
        in_flight = self._tracker.in_flight()
        if self.ctx.windows is not None:
            self.ctx.windows.hold(self.name, in_flight)
        metrics.IN_FLIGHT.labels(**self.labels).set(in_flight)

    def _work(self, msg: Message, epoch: int) -> None:
        """Worker: handle the record, retrying a dependency's failure with backoff for as long
        as the partition is still this member's under the same epoch; report how it ended."""
        tp, state = _tp(msg), RecordState()

        def owned() -> bool:
            return self._tracker.owns(tp, epoch)

        try:
            handled = owned() and self._retry(msg, lambda: self._process(msg, state), owned) is not None
            self._done.put(_Done(msg, epoch, handled=handled))
        except Exception as exc:  # noqa: BLE001 - handed to the poll loop, which ends the member
            self._done.put(_Done(msg, epoch, handled=False, failure=exc))

    def _collect_done(self, block_s: float) -> None:
        """Apply finished work to the offsets; keep the first fatal failure for the loop."""
        try:
            done = self._done.get(timeout=block_s) if block_s else self._done.get_nowait()
        except queue.Empty:
            return
        while True:
            topic, partition, offset = records.place(done.msg)
            self._tracker.completed((topic, partition), offset, done.epoch, done.handled)
            if done.failure is not None and self._fatal is None:
                self._fatal = (f"{self.name}: {done.msg.topic()}:{done.msg.partition()}@"
                               f"{done.msg.offset()} failed in a way no retry or dead letter "
                               "fits; nothing is committed past it", done.failure)
            try:
                done = self._done.get_nowait()
            except queue.Empty:
                return

    def _commit_completed(self, tps: set[tuple[str, int]], asynchronous: bool = False) -> bool:
        """Commit what was handled; False when a synchronous commit failed. The poll loop's
        periodic commits are asynchronous: waiting for the coordinator there (tens of ms, more
        with replicated offsets) held back every record the loop would have dispatched
        meanwhile. Handing partitions back waits."""
        positions = self._tracker.committable(tps)
        if asynchronous and self._transactions is None:
            return self._commit(positions, asynchronous=True)  # marked committed in `_on_commit`
        if not self._commit(positions):
            return False
        self._tracker.mark_committed(positions)
        return True

    def _release_partitions(self, tps: set[tuple[str, int]], commit: bool) -> None:
        """Drop the partitions' buffered records, let their in-flight calls finish within the
        deadline, and commit what was handled."""
        if self._buffer is not None:
            self._release_flow(self._buffer, tps, commit)
        self._lent -= tps

    def _release_flow(self, buffer: FetchBuffer, tps: set[tuple[str, int]], commit: bool) -> None:
        buffer.drop(tps)
        self._tracker.releasing(tps)
        if commit:
            deadline = time.monotonic() + self.settings.revoke_deadline_s
            while self._tracker.in_flight(tps) and time.monotonic() < deadline:
                self._collect_done(block_s=0.05)
            abandoned = self._tracker.in_flight(tps)
            if abandoned:
                log.warning("%s: revoke deadline passed with %d records in flight; they will be "
                            "consumed again", self.name, abandoned)
            self._commit_completed(tps)
        self._tracker.forget(tps)

    # ----------------------------------------------------------------- loans to a canary
    @property
    def loan_lease_s(self) -> float:
        """How long a canary keeps a partition without renewing: two ticks under its group's
        session timeout, so a killed candidate's partitions are back (the lapse seen at the next
        tick, the take-back committed) within the time a killed member's would be, and never under
        a few ticks, so one slow renewal does not take them away."""
        session_s = float(self.settings.kafka_config().get("session.timeout.ms", 45000)) / 1000
        return max(session_s - 2 * LOAN_TICK_S, LOAN_LEASE_TICKS * LOAN_TICK_S)

    def _hold_back_lent(self, store: canary_loans.LoanStore, tps: set[tuple[str, int]]) -> None:
        """Partitions the group just gave this member: hold back those lent to a canary (all of
        them while the loans cannot be read: the candidate may be on any), before any record
        of theirs is dispatched. The next tick takes back what is not lent."""
        assert self._buffer is not None  # group events are served inside the loop's polls
        try:
            loans = store.loans(self.settings.group_id, self.topic)
            lent = {tp for tp in tps if tp[1] in loans}
        except Exception as exc:  # noqa: BLE001 - a dependency: sorted out by the next tick
            log.warning("%s: partition loans unreadable (%s); holding back %d new partitions",
                        self.name, exc, len(tps))
            lent = set(tps)
        for tp in lent:
            self._buffer.hold_back(tp, pause=False)  # not assigned yet: paused by reassert_pause
        self._lent |= lent

    def _tend_loans(self, store: canary_loans.LoanStore, buffer: FetchBuffer) -> None:
        """Hand over the partitions a canary asks for, and take back those it returned, those
        whose lease lapsed (the candidate died) and those held back that are not lent. The
        store unreachable, nothing changes hands."""
        try:
            loans = store.loans(self.settings.group_id, self.topic)
        except Exception as exc:  # noqa: BLE001 - a dependency: tried again next tick
            log.warning("%s: partition loans unreadable (%s); nothing changes hands", self.name, exc)
            return
        for tp in sorted(self.assignment):
            loan = loans.get(tp[1])
            if loan is not None and loan.state == canary_loans.LENDING:
                self._lend(store, buffer, tp)
            elif tp in self._lent and (loan is None or loan.state == canary_loans.RETURNED or loan.lapsed):
                self._take_back(store, buffer, tp, loan)

    def _lend(self, store: canary_loans.LoanStore, buffer: FetchBuffer, tp: tuple[str, int]) -> None:
        """Drain `tp`, commit what was handled and lend it from the group's committed position."""
        self._release_flow(buffer, {tp}, commit=True)
        buffer.hold_back(tp)
        self._lent.add(tp)
        position = self._start_of(self._consumer, tp)
        store.handed_over(self.settings.group_id, tp[0], tp[1], position, self.loan_lease_s)
        self._record("lend", [f"{tp[0]}:{tp[1]}@{position}"])

    def _take_back(self, store: canary_loans.LoanStore, buffer: FetchBuffer, tp: tuple[str, int],
                   loan: canary_loans.Loan | None) -> None:
        """Go on from where the canary stopped: the position it returned; when it died, the later
        of where it was lent and its group's last commit; when `tp` is not lent, this group's
        commit. The position is committed in this group before the loan's row goes, so whoever
        owns `tp` next starts there too."""
        if loan is None:
            position = self._start_of(self._consumer, tp)
        elif loan.state == canary_loans.RETURNED and loan.position is not None:
            position = loan.position
        else:
            position = max(self._borrower_commit(tp, loan.canary_id), loan.position or 0)
        if not self._commit({tp: position}):
            return  # held back until a commit goes through
        if loan is not None:
            store.taken_back(self.settings.group_id, tp[0], tp[1])
        self._lent.discard(tp)
        self._tracker.assigned(tp)
        self._tracker.mark_committed({tp: position})
        self._consumer.seek(TopicPartition(tp[0], tp[1], position))
        buffer.go_on(tp)
        self._record("take_back", [f"{tp[0]}:{tp[1]}@{position}"])

    def _borrower_commit(self, tp: tuple[str, int], canary_id: int) -> int:
        """The canary group's last commit on `tp` (0 when none)."""
        group = canary_group(self.settings.group_id, canary_id)
        reader = Consumer(self.settings.kafka.client(**{"group.id": group, "enable.auto.commit": False}))
        try:
            offset = reader.committed([TopicPartition(*tp)], timeout=10)[0].offset
        finally:
            reader.close()
        return offset if offset >= 0 else 0

    @staticmethod
    def _start_of(consumer: Consumer, tp: tuple[str, int]) -> int:
        """Where `tp` goes on under `consumer`'s group: its commit, else (as the group's offset
        reset says) the partition's first offset."""
        offset = consumer.committed([TopicPartition(*tp)], timeout=10)[0].offset
        if offset >= 0:
            return int(offset)
        return int(consumer.get_watermark_offsets(TopicPartition(*tp), timeout=10)[0])

    def _shutdown_flow(self, buffer: FetchBuffer) -> None:
        """Stop taking work, let in-flight records finish within the deadline, commit.

        A fleet's members stop together, and the first to leave its group starts a rebalance:
        the others' last commit then carries a generation that is gone and is refused (with
        exactly-once outputs, the outputs with it). They poll until the group gives them the
        new generation and commit again, within the deadline; what they poll meanwhile is left
        to the partitions' next owner."""
        buffer.clear()
        deadline = time.monotonic() + self.settings.revoke_deadline_s
        while self._tracker.in_flight() and time.monotonic() < deadline:
            self._collect_done(block_s=0.05)
        while not self._commit_completed(set(self.assignment)) and time.monotonic() < deadline:
            self._consumer.poll(0.2)
            buffer.clear()
        self._release(set(self.assignment), commit=True)
        if self.ctx.windows is not None:
            self.ctx.windows.hold(self.name, self._tracker.in_flight())


@dataclass(frozen=True)
class _Done:
    """How a worker finished with a record, under the epoch it was dispatched in."""

    msg: Message
    epoch: int
    handled: bool
    failure: Exception | None = None
