"""What every member of a stage's group shares, whatever the group's kind and the mode.

A consumer-group member runs in one of three modes (`MemberSettings.mode`): `baseline` and
`bounded` consume in batches (`consumers.runtime.batch_member`), `flow` decouples polling from
processing (`consumers.runtime.flow_member`); both build on `consumers.runtime.group_member`. A
share-group member (`consumers.runtime.share_member`) builds on `StageMember` too.

Whatever the mode, an offset is committed only past records that were handled: completed, or
dead-lettered because they are their own fault (`consumers.runtime.failures`). A dependency's
failure (database, broker, dead-letter topic) is retried while the partition waits: `flow`
retries in the worker, whose slot stays taken, so the window fills and the fetch buffer applies
its back-pressure while polling keeps the member in its group; `baseline` and `bounded` seek the
partition back to the record and poll on. Any other failure takes the member down, and with it
the fleet process, so its supervisor restarts it: nothing is committed past that record.

`StageMember` holds what does not depend on the kind of group: handling one record to the end
or dead-lettering it, retrying a dependency's failure, group events and client statistics.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import KafkaError, Message

from consumers.ai.client import AIBadAnswer, AIUnavailable, EndpointDown
from consumers.config import events, profiles
from consumers.config.kafka_connection import KafkaConnection
from consumers.config.pipeline_spec import Route
from consumers.kafka_clients import records
from consumers.runtime import dead_letter, failures, metrics, stages
from consumers.runtime.outbox import DELIVERY_TIMEOUT_S, Outgoing
from consumers.runtime.stages import RecordState, StageContext, handle
from consumers.runtime.storage import Origin

log = logging.getLogger(__name__)

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
    commit_interval_s: float | None = None  # flow; None: the default for its outputs (`commit_every_s`)
    revoke_deadline_s: float = 30.0
    stats_interval_ms: int = 0
    exactly_once: bool = False  # outputs and offsets in one transaction (`consumers.runtime.outbox`)
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
                                                    window=self.window, time_scale=self.time_scale)
        else:
            config = profiles.consumer_config(self.profile, self.kafka, self.group_id, mode=self.mode,
                                              time_scale=self.time_scale,
                                              group_protocol=self.group_protocol)
        if self.stats_interval_ms:
            config["statistics.interval.ms"] = self.stats_interval_ms
        return config


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
