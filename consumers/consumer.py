"""One member of a stage's consumer group, in one of three modes; what every member shares.

baseline  consume up to 500 records, process them one by one, commit after the batch: the
          client defaults of the reference article, which get expelled when a batch outlasts
          `max.poll.interval.ms`.
bounded   consume `batch_size` records sized so a batch always finishes well inside
          `max.poll.interval.ms`, process, commit: one request in flight per member.
flow      polling decoupled from processing: records go to an application buffer
          (`FetchBuffer`: coarse pause/resume with hysteresis) and run on a pool of `window`
          workers (the member's share of the AI concurrency); offsets are committed at the
          highest contiguous completed position, asynchronously (the poll loop does not
          wait). On revocation it finishes (or, past a deadline, abandons) the revoked
          partitions' work and commits, waiting for it, before letting them go.

Whatever the mode, an offset is committed only past records that were handled: completed, or
dead-lettered because they are their own fault (`consumers.failures`). A dependency's failure
(database, broker, dead-letter topic) is retried while the partition waits: `flow` retries in
the worker, whose slot stays taken, so the window fills and the fetch buffer applies its
back-pressure while polling keeps the member in its group; `baseline` and `bounded` seek the
partition back to the record and poll on. Any other failure takes the member down, and with
it the fleet process, so its supervisor restarts it: nothing is committed past that record.

`StageMember` holds what does not depend on the kind of group: handling one record to the end
or dead-lettering it, retrying a dependency's failure, group events and client statistics. The
share-group member (`consumers.share_member`) builds on it too.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from consumers import dead_letter, events, failures, metrics, profiles, records, stages
from consumers.ai_client import AIBadAnswer, AIUnavailable, EndpointDown
from consumers.fetch_buffer import FetchBuffer
from consumers.kafka_connection import KafkaConnection
from consumers.offsets import OffsetTracker
from consumers.outbox import DELIVERY_TIMEOUT_S, Outgoing, TransactionalOutbox, transactional_id
from consumers.pipeline_spec import Route
from consumers.stages import RecordState, StageContext, handle
from consumers.storage import Origin

log = logging.getLogger(__name__)

BASELINE_BATCH = 500  # the Java client's max.poll.records default
# Statistics arrive every `stats_interval_ms`; writing each one would put a database round trip
# into every member's poll loop (at 128 members that starves the loops), so the history is
# kept at this granularity and the last snapshot is written when the member closes.
STATS_RECORD_INTERVAL_S = 10.0
# Backoff between tries of a record whose dependency failed: doubling up to the cap, in real
# seconds (an outage lasts as long as it lasts, whatever the experiment's time scale).
TRANSIENT_BACKOFF_S = 0.1
TRANSIENT_BACKOFF_MAX_S = 5.0

COMMIT_INTERVAL_S = 0.5
EXACTLY_ONCE_COMMIT_INTERVAL_S = 0.1
# Dead-letter reasons that mean the request failed for good: the spec's failure notice tells its user.
FAILED_FOR_GOOD = ("ai_unavailable", "ai_bad_answer", "work_failed")

T = TypeVar("T")


@dataclass(frozen=True)
class MemberSettings:
    """How one member consumes; the fleet builds one per member."""

    run_id: str
    stage: str
    mode: str
    group_id: str
    kafka: KafkaConnection
    profile: str = "durability"
    time_scale: float = 1.0
    group_protocol: str = "classic"
    batch_size: int = 1  # bounded
    window: int = 16  # flow: records in flight; share: records per poll, handled at once
    buffer: int = 64  # flow: application buffer that triggers a pause
    commit_interval_s: float | None = None  # flow: None takes the outbox's (`commit_every_s`)
    revoke_deadline_s: float = 30.0
    stats_interval_ms: int = 0
    consumer_overrides: tuple[tuple[str, Any], ...] = ()
    exactly_once: bool = False  # outputs and offsets in one transaction (`consumers.outbox`)
    producer_batch_records: int | None = None  # PipelineConfig.producer_batch_records

    def __post_init__(self) -> None:
        modes = profiles.TRANSACTIONAL_MODES
        if self.exactly_once and self.mode not in modes:
            raise ValueError(f"exactly-once outputs need a stage in {' or '.join(modes)} "
                             f"mode; {self.stage} is in {self.mode!r} mode")

    @property
    def transient_backoff_max_s(self) -> float:
        """Cap of the retry backoff: also bounded so a waiting poll loop stays in its group."""
        return min(TRANSIENT_BACKOFF_MAX_S, self.kafka_config()["max.poll.interval.ms"] / 1000 / 5)

    @property
    def commit_every_s(self) -> float:
        """Flow mode's commit interval. Exactly once, a stage's outputs are seen downstream only
        once the transaction that commits their offsets does, so the interval adds to every
        hop's latency: it is Kafka Streams' exactly-once default rather than at least once's."""
        if self.commit_interval_s is not None:
            return self.commit_interval_s
        return EXACTLY_ONCE_COMMIT_INTERVAL_S if self.exactly_once else COMMIT_INTERVAL_S

    @property
    def commit_budget_s(self) -> float:
        """How long one exactly-once commit may wait for the cluster: a fifth of the poll
        interval, so a cluster that stops answering cannot hold the poll loop out of its group."""
        return min(DELIVERY_TIMEOUT_S, self.kafka_config()["max.poll.interval.ms"] / 1000 / 5)

    def kafka_config(self) -> dict[str, Any]:
        if self.mode == "share":
            config = profiles.share_consumer_config(self.profile, self.kafka, self.group_id,
                                                    window=self.window, time_scale=self.time_scale,
                                                    **dict(self.consumer_overrides))
        else:
            config = profiles.consumer_config(self.profile, self.kafka, self.group_id, mode=self.mode,
                                              time_scale=self.time_scale,
                                              group_protocol=self.group_protocol,
                                              **dict(self.consumer_overrides))
        if self.stats_interval_ms:
            config["statistics.interval.ms"] = self.stats_interval_ms
        return config


def _tp(msg: Message) -> tuple[str, int]:
    return records.place(msg)[:2]


def _names(partitions: list[TopicPartition]) -> list[str]:
    return [f"{p.topic}:{p.partition}" for p in partitions]


def stats_summary(raw: str) -> dict[str, Any]:
    """The parts of librdkafka's statistics the analysis needs (the full document is large)."""
    stats = json.loads(raw)
    partitions = {}
    for topic, tstats in stats.get("topics", {}).items():
        for pid, p in tstats.get("partitions", {}).items():
            if pid != "-1" and p.get("rxmsgs", 0):
                partitions[f"{topic}:{pid}"] = {"rxmsgs": p["rxmsgs"], "rxbytes": p["rxbytes"],
                                                "consumer_lag": p.get("consumer_lag", -1)}
    return {"rxmsgs": sum(p["rxmsgs"] for p in partitions.values()),
            "rxbytes": sum(p["rxbytes"] for p in partitions.values()),
            "rebalance_cnt": stats.get("cgrp", {}).get("rebalance_cnt", 0),
            "assignment_size": stats.get("cgrp", {}).get("assignment_size", 0),
            "partitions": partitions}


class StageMember:
    """A member of a stage's group, whatever the group's kind; `run()` returns when `stop` is set."""

    def __init__(self, name: str, settings: MemberSettings, ctx: StageContext) -> None:
        self.name = name
        self.settings = settings
        self.ctx = ctx
        self.labels = {"stage": settings.stage, "member": name}
        self.topic = ctx.topics.source_of(settings.stage)
        self.assignment: set[tuple[str, int]] = set()  # as far as the client tells
        self.assigned_once = threading.Event()
        self.consumed_bytes = 0  # key + value bytes handed to the application
        self.last_stats: dict[str, Any] = {}
        self._stats_recorded_at = 0.0
        self.failure: BaseException | None = None
        self._unrecorded: list[tuple[str, list[str]]] = []  # group events not yet stored

    def run(self, stop: threading.Event) -> None:
        """Consume until `stop`; a failure is kept in `self.failure` for the fleet to report."""
        try:
            self._run(stop)
        except BaseException as exc:
            self.failure = exc
            log.exception("%s failed", self.name)
            raise

    def _run(self, stop: threading.Event) -> None:
        raise NotImplementedError

    def _closed(self) -> None:
        """Once the client is closed: count it, and store the last statistics."""
        self._record("closed", [])
        if self.last_stats:
            self._best_effort(self.ctx.storage.record_stats, self.settings.run_id, self.name,
                              self.last_stats)

    # ----------------------------------------------------------------- group events
    def _best_effort(self, write: Callable[..., None], *args: Any) -> bool:
        """A bookkeeping write that must not stop the loop while its dependency is down."""
        try:
            write(*args)
            return True
        except Exception as exc:
            if failures.classify(exc).kind != failures.TRANSIENT:
                raise
            log.warning("%s: %s not recorded yet: %s", self.name, write.__name__, exc)
            return False

    def _record(self, event: str, partitions: list[str]) -> None:
        """Count a group event and store it; events that meet a database outage wait in order."""
        metrics.REBALANCES.labels(**self.labels, event=event).inc()
        if event != "closed":
            self._unrecorded.append((event, partitions))
        self._store_group_events()

    def _store_group_events(self) -> None:
        while self._unrecorded and self._best_effort(
                self.ctx.storage.record_rebalance, self.settings.run_id, self.settings.group_id,
                self.name, *self._unrecorded[0]):
            self._unrecorded.pop(0)

    def _on_stats(self, raw: str) -> None:
        self._keep_stats(stats_summary(raw))

    def _keep_stats(self, summary: dict[str, Any]) -> None:
        """The latest statistics for the lag gauge and the member's close; stored every
        STATS_RECORD_INTERVAL_S."""
        summary.update(self._app_stats())
        self.last_stats = summary
        metrics.LAG.labels(**self.labels).set(
            sum(max(0, p["consumer_lag"]) for p in summary["partitions"].values()))
        if time.monotonic() - self._stats_recorded_at >= STATS_RECORD_INTERVAL_S:
            self._stats_recorded_at = time.monotonic()
            self._best_effort(self.ctx.storage.record_stats, self.settings.run_id, self.name, summary)

    def _app_stats(self) -> dict[str, Any]:
        """What the application took beside the client's own counts."""
        return {"app_consumed_bytes": self.consumed_bytes, "pause_cycles": 0}

    # ----------------------------------------------------------------- one record
    def _process(self, msg: Message, state: RecordState) -> bool:
        """Handle one record to the end: True when done, False when dead-lettered because it is
        its own fault.

        Raises when it could not be handled: `failures.classify` says whether to retry.
        """
        origin = self._origin(msg)
        event: dict[str, Any] | None = None
        try:
            event = self._event(msg)
            handle(self.ctx, event, origin, state)
        except Exception as exc:
            verdict = failures.classify(exc)
            if verdict.kind != failures.POISON:
                raise
            detail = (exc.detail if isinstance(exc, events.InvalidEvent)
                      else exc.reason if isinstance(exc, AIUnavailable | AIBadAnswer | failures.WorkFailed)
                      else repr(exc))
            self._dead_letter(msg, origin, event, verdict.reason, detail, state)
            return False
        metrics.COMPLETED.labels(**self.labels).inc()
        if state.skipped_duplicate:
            metrics.DUPLICATES.labels(**self.labels).inc()
        retries = max(0, len(state.tries) - 1)
        if retries:
            metrics.RETRIES.labels(**self.labels).inc(retries)
        return True

    def _origin(self, msg: Message) -> Origin:
        return Origin(self.name, *records.place(msg), dead_letter.redrive_round(records.headers(msg)))

    def _event(self, msg: Message) -> dict[str, Any]:
        """The record's event, validated against the stage's schema (raises InvalidEvent)."""
        return events.parse(self.ctx.topics.spec.validators[self.settings.stage], msg.value())

    def _dead_letter(self, msg: Message, origin: Origin, event: dict[str, Any] | None, reason: str,
                     detail: str, state: RecordState) -> None:
        """To the table, then to the dead-letter topic (a reference when a copy would not fit)
        with the failure notice, if the request failed for good."""
        key = self.ctx.key(event) if event is not None else None
        spec = self.ctx.topics.spec
        self.ctx.storage.record_dead_letter(spec.name, self.settings.run_id, key, self.settings.stage,
                                           f"{reason}: {detail}"[:1000], origin,
                                           dead_letter.stored_payload(msg.value()), self.ctx.entry,
                                           kafka_key=msg.key())
        record = dead_letter.build(
            msg.value(), msg.key(), records.headers(msg), reason=reason, detail=detail,
            topic=origin.topic, partition=origin.partition, offset=origin.offset,
            stage=self.settings.stage, max_bytes=dead_letter.producer_max_bytes(self.settings.profile))
        outgoing = [Outgoing(self.ctx.topics.dead_letter, record.value or b"", record.key, record.headers)]
        notice = spec.failure_notice
        if key is not None and notice is not None and reason in FAILED_FOR_GOOD:
            route = Route(to=notice.to, fields={**notice.fields, "reason": reason})
            outgoing.append(self.ctx.outgoing(notice.to, stages.message(route, spec.key, key, event or {})))
        self.ctx.outbox.deliver(origin, outgoing, None)
        metrics.ERRORS.labels(**self.labels, reason=reason).inc()

    def _transient(self, msg: Message, exc: Exception) -> None:
        """Say why a record waits; counted per reason."""
        reason = failures.classify(exc).reason
        metrics.WAITING.labels(**self.labels, reason=reason).inc()
        log.warning("%s: %s:%d@%d waits (%s): %s", self.name, msg.topic(), msg.partition(),
                    msg.offset(), reason, exc)

    def _retry(self, msg: Message, attempt: Callable[[], T], keep_going: Callable[[], bool]) -> T | None:
        """`attempt()`'s result, retrying a dependency's failure with backoff for as long as
        `keep_going()`; None once it says stop. Any other failure raises."""
        backoff = TRANSIENT_BACKOFF_S
        while True:
            try:
                return attempt()
            except Exception as exc:
                if failures.classify(exc).kind != failures.TRANSIENT:
                    raise
                self._transient(msg, exc)
                deadline = time.monotonic() + backoff
                while time.monotonic() < deadline and keep_going():
                    time.sleep(min(0.05, backoff))
                if not keep_going():
                    return None
                # an endpoint's circuit is asked again at once: no database or call until it admits
                backoff = (TRANSIENT_BACKOFF_S if isinstance(exc, EndpointDown)
                           else min(2 * backoff, self.settings.transient_backoff_max_s))

    def _accept(self, msgs: Iterable[Message], on_record: Callable[[Message], None]) -> None:
        """Route fetched records, handling the client errors that arrive as messages."""
        for msg in msgs:
            err = msg.error()
            if err is None:
                self.consumed_bytes += len(msg.value() or b"") + len(msg.key() or b"")
                on_record(msg)
            elif err.code() == KafkaError._MAX_POLL_EXCEEDED:
                log.warning("%s: expelled from the group: %s", self.name, err)
                self._record("max_poll_exceeded", sorted(f"{t}:{p}" for t, p in self.assignment))
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("%s: consume error: %s", self.name, err)


class Member(StageMember):
    """A consumer-group member running one stage in baseline, bounded or flow mode."""

    def __init__(self, name: str, settings: MemberSettings, ctx: StageContext) -> None:
        super().__init__(name, settings, ctx)
        self._consumer: Consumer  # made by _run, which runs everything else
        # baseline / bounded: the state of records sought back after a transient failure, and
        # positions handled whose commit failed (retried with the next batch's, unless revoked)
        self._retrying: dict[tuple[str, int, int], RecordState] = {}
        self._uncommitted: dict[tuple[str, int], int] = {}
        # flow-mode state
        self._buffer: FetchBuffer | None = None
        self._done: queue.SimpleQueue[_Done] = queue.SimpleQueue()
        self._tracker = OffsetTracker()
        self._assignment_changed = False
        self._fatal: tuple[str, Exception] | None = None  # a worker failure that ends the member
        self._transactions: TransactionalOutbox | None = None  # exactly once: the member's own

    # ----------------------------------------------------------------- lifecycle
    def _run(self, stop: threading.Event) -> None:
        config = self.settings.kafka_config()
        config["client.id"] = self.name
        if self.settings.stats_interval_ms:
            config["stats_cb"] = self._on_stats
        if self.settings.exactly_once:
            self._transactions = self._transactional_outbox()
            self.ctx = replace(self.ctx, outbox=self._transactions)
        elif self.settings.mode == "flow":
            config["on_commit"] = self._on_commit
        self._consumer = Consumer(config)
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_lost)
        try:
            if self.settings.mode == "flow":
                self._run_flow(stop)
            else:
                self._run_batches(stop)
        finally:
            self._consumer.close()  # leaves the group; triggers a final revoke
            if self._transactions is not None:
                self._transactions.close()
            self._closed()

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
        for tp in assigned:
            self._tracker.assigned(tp)
        self.assignment |= assigned
        self._record("assign", _names(partitions))
        self._assignment_changed = True
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

    def _app_stats(self) -> dict[str, Any]:
        """Flow mode counts what its buffer took from the client too, and its pause cycles."""
        buffered = self._buffer
        return {"app_consumed_bytes": self.consumed_bytes + (buffered.delivered_bytes if buffered else 0),
                "pause_cycles": buffered.pause_cycles if buffered else 0}

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

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Flow mode's commits, served inside poll: a position counts as committed once the
        coordinator took it; one it refused stays pending and goes with the next commit."""
        taken = {(p.topic, p.partition): p.offset for p in partitions if err is None and p.error is None}
        self._tracker.mark_committed(taken)
        if len(taken) < len(partitions):
            log.warning("%s: commit refused: %s", self.name,
                        err or [f"{p.topic}:{p.partition}: {p.error}" for p in partitions if p.error])

    # ----------------------------------------------------------------- baseline / bounded
    def _run_batches(self, stop: threading.Event) -> None:
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

    # ----------------------------------------------------------------- flow
    def _run_flow(self, stop: threading.Event) -> None:
        s = self.settings
        poll_interval_s = s.kafka_config()["max.poll.interval.ms"] / 1000
        self._buffer = FetchBuffer(self._consumer, high=s.buffer, keepalive_s=min(1.0, poll_interval_s / 10),
                                   pause_after_s=poll_interval_s / 3)
        last_commit = time.monotonic()
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
            finally:
                self._shutdown_flow(self._buffer)
        if self._fatal is not None:  # a worker failed while the member was stopping
            raise RuntimeError(self._fatal[0]) from self._fatal[1]

    def _unexpected(self, msg: Message) -> None:
        raise AssertionError(f"FetchBuffer returned a data record: {msg.topic()}:{msg.partition()}")

    def _free_slots(self) -> int:
        """Records that may start now: room in the window (the fleet's pooled windows, when it
        has several members) and, when the fleet's AI calls follow a limit, no more than the
        limit has spare (the rest wait in the buffer, where its back-pressure applies, rather
        than in a worker)."""
        in_flight = self._tracker.in_flight()
        windows = self.ctx.windows
        free = self.settings.window - in_flight if windows is None else windows.free(self.name, in_flight)
        limiter = self.ctx.ai.limiter if self.ctx.ai is not None else None
        return free if limiter is None else min(free, limiter.spare())

    def _dispatch(self, pool: ThreadPoolExecutor, buffer: FetchBuffer) -> None:
        for _ in range(self._free_slots()):  # counted once: workers take their permits later
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

    def _release(self, tps: set[tuple[str, int]], commit: bool) -> None:
        """Hand partitions back: stop their retries and forget what they had not committed; in
        flow mode, drop their buffered records, let in-flight calls finish within the deadline,
        and commit what was handled."""
        for key in [k for k in self._retrying if k[:2] in tps]:
            del self._retrying[key]
        for tp in tps & self._uncommitted.keys():
            del self._uncommitted[tp]
        if self._buffer is not None:
            self._release_flow(self._buffer, tps, commit)
        if self._transactions is not None:
            self._transactions.drop(tps)

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
