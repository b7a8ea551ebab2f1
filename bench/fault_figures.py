"""Figures of a fault-injection phase that bench/figures.py does not define (yet).

The standard figures (produced, completed, lost, duplicate_ai_calls, completion times, as
`measure.figures` defines them) come from `bench.figures.scenario_figures`; these add what only
a fault run needs. Definitions:

- pre_fault_rps: completions (generate results) per second over the `baseline_s` seconds
  before the fault started; fault_rps: the same while the fault was in force.
- longest_stall_s: the longest time without a completion between the fault's start and the
  end of the load: how long the pipeline stood still.
- recovery_s: seconds from the fault's end to the first whole second s at which the
  completions in [end + s, end + s + window_s) reach 90 % of pre_fault_rps (None: not within
  the load). A count over a window, not `figures.steady_rate`: that slope drops the ends of
  its input, which is what a plateau needs and a short recovery window does not.
- duplicate_results: requests that got more than one distinct final outcome, either in
  PostgreSQL (a stage result and a dead letter for the same request and stage) or on the
  notify topic (final messages to the user that differ: a link and a failure, two links).
  Re-sending the same final message is the pipeline's documented at-least-once behaviour
  (downstream is idempotent by request id) and is counted apart, as resent_notifications.
- uncommitted: per consumer group, end offset minus committed offset over its input topic's
  partitions (the low watermark where nothing was committed): records not yet behind it.
- unexpected_dead_letters: dead letters beyond what the phase itself injected as poison
  (per reason, the larger of the `dead_letters` rows and the dead-letter topic's records, so
  one written to only one of them still counts).
- poison (for a phase whose pipeline fails chosen requests by design, `Poison`): of the
  request ids on the measured topic, those it fails are `expected`; `dead_lettered_once` of
  them have exactly one `dead_letters` row, with the reason they must carry, and at most one
  record on the dead-letter topic; `missing` have none, `twice` more than one (table or topic),
  `wrong_reason` one with another reason; `unexpected` requests are dead-lettered without being
  expected; `good_not_completed` are the other requests not completed.
- fleet_pids (recorded by the harness): each stage's fleet process id as supervisord reports it
  once the fleets are ready and again before they are stopped; a changed or missing one is a
  fleet that exited.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import psycopg2
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench import figures
from bench.fault_record import InjectedRecord, Injection, Load, PhaseFigures, PhaseRecord, PoisonOutcomes
from bench.report import per_second
from consumers.config import pipeline_spec
from consumers.config.events import Topics
from consumers.config.kafka_connection import KafkaConnection
from infra.kafka_tools import topic_values
from measure.figures import beyond_first

RECOVERY_SHARE = 0.9
FINAL_KINDS = ("result", "rejected", "failed")  # notifications that end a request for the user
SERVICE_COUNTERS = ("served", "distinct_served", "duplicate_served", "rejected_429", "rate_limited",
                    "errors_5xx", "hangs")


def rate_between(times: Iterable[float], start: float, end: float) -> float:
    """Completions per second in [start, end)."""
    if end <= start:
        return 0.0
    return sum(1 for t in times if start <= t < end) / (end - start)


def recovery_s(times: list[float], fault_start: float, fault_end: float, load_end: float,
               baseline_s: float, window_s: float) -> tuple[float, int | None]:
    """(pre-fault completion rate, seconds after the fault's end until a `window_s` window
    reaches RECOVERY_SHARE of it); the window must end before the load does."""
    pre = rate_between(times, fault_start - baseline_s, fault_start)
    if pre == 0:
        return 0.0, None
    second = 0
    while fault_end + second + window_s <= load_end:
        start = fault_end + second
        if rate_between(times, start, start + window_s) >= RECOVERY_SHARE * pre:
            return pre, second
        second += 1
    return pre, None


def longest_stall_s(times: Iterable[float], start: float, end: float) -> float:
    """The longest gap between completions in [start, end], the bounds counting as ends of gaps."""
    points = [start, *sorted(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in pairwise(points))


def final_outcome(notification: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, what it says) of a final notification, None for any other message."""
    kind = notification.get("kind")
    if kind not in FINAL_KINDS:
        return None
    said = {k: v for k, v in notification.items() if k not in ("request_id", "run_id", "kind", "at")}
    return kind, json.dumps(said, sort_keys=True)


def notification_outcomes(notifications: Iterable[Mapping[str, Any]]) -> tuple[set[str], int]:
    """(requests told more than one distinct final outcome, final messages resent unchanged)."""
    outcomes: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
    for notification in notifications:
        outcome = final_outcome(notification)
        if outcome is not None:
            outcomes[notification["request_id"]][outcome] += 1
    conflicting = {request for request, seen in outcomes.items() if len(seen) > 1}
    resent = sum(count - 1 for seen in outcomes.values() for count in seen.values())
    return conflicting, resent


def reason_code(reason: str) -> str:
    """The machine-readable code of a stored dead-letter reason ('<code>: <detail>')."""
    return reason.split(":", 1)[0].strip()


def reasons_by_code(rows: Iterable[tuple[str, int]]) -> Counter[str]:
    """Dead letters per reason code, from (stored reason, count) rows whose details differ."""
    counts: Counter[str] = Counter()
    for reason, n in rows:
        counts[reason_code(reason)] += n
    return counts


def unexpected_dead_letters(rows: Mapping[str, int], topic: Mapping[str, int],
                            allowed: Mapping[str, int | None]) -> int:
    """Dead letters per reason (the larger of table and topic) beyond what `allowed` permits
    for that reason (None: any number)."""
    total = 0
    for reason in set(rows) | set(topic):
        seen = max(rows.get(reason, 0), topic.get(reason, 0))
        limit = allowed.get(reason, 0)
        if limit is not None:
            total += max(0, seen - limit)
    return total


@dataclass(frozen=True)
class Poison:
    """Requests a phase's own pipeline fails by design: which (by key), and the dead-letter
    reason each one's letter must carry."""

    fails: Callable[[str], bool]
    reason: Callable[[str], str]


def poison_outcomes(request_ids: Iterable[str], poison: Poison, letters: Iterable[tuple[str, str]],
                    topic_letters: Mapping[str, int], completed: set[str]) -> PoisonOutcomes:
    """How the requests a pipeline fails by design ended (see the module docstring): `letters`
    are the (request id, reason) rows of `dead_letters`, `topic_letters` the dead-letter topic's
    records per request id, `completed` the requests whose status is completed."""
    ids = set(request_ids)
    expected = {r for r in ids if poison.fails(r)}
    reasons: dict[str, list[str]] = defaultdict(list)
    for request, reason in letters:
        reasons[request].append(reason)
    twice = {r for r in set(reasons) | set(topic_letters)
             if len(reasons.get(r, [])) > 1 or topic_letters.get(r, 0) > 1}
    once = {r for r in expected - twice if reasons.get(r) == [poison.reason(r)]}
    return PoisonOutcomes(expected=len(expected), dead_lettered_once=len(once),
                          missing=len(expected - set(reasons)), twice=len(twice),
                          wrong_reason=len({r for r in expected - twice if r in reasons} - once),
                          unexpected=len((set(reasons) | set(topic_letters)) - expected),
                          good_not_completed=len(ids - expected - completed))


def exited_fleets(fleet_pids: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Stages whose fleet process at the end of the phase is not the one at its start."""
    return [stage for stage, pids in fleet_pids.items() if not pids["end"] or pids["end"] != pids["start"]]


def verdict(record: PhaseRecord) -> list[str]:
    """Why a phase failed (empty: it passed), from its figures and the bounds its fault set:
    lost requests, duplicate results, AI calls the service served twice beyond what the fault
    allows (and one more per call the service held past the client's timeout: its retry is paid
    again), our rows' count of them other than the service's, dead letters for a reason the phase
    did not inject, records left uncommitted, a recovery slower than the fault's bound, a fleet
    process that exited under a fault it must survive, requests failed by design that did not end
    as designed, or a harness error (the fault could not be measured)."""
    failures = [] if record.error is None else [f"not measured: {record.error}"]
    f = record.figures
    if f is not None:
        failures.extend(figure_breaches(record, f))
    if record.fleets_stay_up and record.fleet_pids is not None:
        pids = record.fleet_pids
        failures.extend(f"fleet {stage} exited (pid {pids[stage]['start']} at the start, "
                        f"{pids[stage]['end']} at the end)" for stage in exited_fleets(pids))
    if f is not None and f.poison is not None:
        failures.extend(f.poison.breaches())
    return failures


def figure_breaches(record: PhaseRecord, f: PhaseFigures) -> list[str]:
    """The breaches `verdict` reads from a measured phase's figures, up to its recovery."""
    failures = []
    if f.lost > 0:
        failures.append(f"{f.lost} lost")
    if f.duplicate_results > 0:
        failures.append(f"{f.duplicate_results} duplicate results")
    if record.exactly_once and f.duplicate_outputs > 0:
        failures.append(f"{f.duplicate_outputs} output events seen twice by a read_committed reader")
    if f.duplicate_ai_calls != f.service_duplicates:
        failures.append(f"{f.duplicate_ai_calls} duplicate AI calls by our rows, "
                        f"{f.service_duplicates} by the service")
    allowed = record.allowed_service_duplicates + f.service_hangs
    if f.service_duplicates > allowed:
        failures.append(f"{f.service_duplicates} AI calls served twice (allowed {allowed})")
    if f.unexpected_dead_letters > 0:
        failures.append(f"{f.unexpected_dead_letters} dead letters for a reason not injected")
    uncommitted = sum(f.uncommitted.values())
    if uncommitted > 0:
        failures.append(f"{uncommitted} records uncommitted after the run")
    bound = record.max_recovery_s
    if bound is not None:
        if f.recovery_s is None:
            failures.append(f"not back to {RECOVERY_SHARE:.0%} of the pre-fault rate within the load")
        elif f.recovery_s > bound:
            failures.append(f"recovery {f.recovery_s} s (bound {bound:g} s)")
    return failures


# ----------------------------------------------------------------------------- Kafka readers
def committed_outputs(kafka: KafkaConnection, topics: Topics) -> dict[str, dict[str, int]]:
    """Per topic the stages write: the events Kafka's own console consumer reads `read_committed`
    (what a downstream service sees), and those beyond the first per (request, kind)."""
    spec = topics.spec
    written = sorted({topics.name(t) for stage in spec.stage_names for t in spec.outputs_of(stage)})
    counted = {}
    for topic, values in topic_values(kafka, written).items():
        seen = Counter((event.get(spec.key), event.get("kind")) for event in map(json.loads, values))
        counted[topic] = {"records": len(values), "duplicates": beyond_first(seen.values())}
    return counted


Record = tuple[bytes | None, dict[str, bytes]]


def read_topic(kafka: KafkaConnection, topic: str, timeout_s: float = 30.0) -> list[Record]:
    """Every record of a topic as (value, headers), read up to the high watermarks."""
    consumer = Consumer(kafka.client(**{"group.id": "faults-reader", "enable.auto.commit": False}))
    try:
        return [(msg.value(), {k: v for k, v in (msg.headers() or []) if v is not None})
                for msg in figures.read_to_end(consumer, topic, timeout_s=timeout_s)]
    finally:
        consumer.close()


def group_uncommitted(kafka: KafkaConnection, group: str, topic: str) -> int:
    """Records of `topic` past `group`'s committed offsets (from the brokers, not the database),
    counted by reading them: offsets would count transaction markers too."""
    consumer = Consumer(kafka.client(**{"group.id": group, "enable.auto.commit": False}))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        starts = {tp.partition: tp.offset if tp.offset >= 0 else OFFSET_BEGINNING for tp in committed}
        return len(figures.read_to_end(consumer, topic, starts))
    finally:
        consumer.close()


def notifications(kafka: KafkaConnection, topic: str) -> list[dict[str, Any]]:
    """The notify topic's messages, decoded."""
    return [json.loads(value) for value, _ in read_topic(kafka, topic) if value]


def request_of(value: bytes | None, key: str) -> str | None:
    """The request id a dead letter's value names, when it is the original event (a letter by
    reference holds only a prefix of it)."""
    try:
        event = json.loads(value or b"")
    except ValueError:
        return None
    return event.get(key) if isinstance(event, dict) else None


def dead_letter_topic(kafka: KafkaConnection, topic: str, key: str,
                      ) -> tuple[Counter[str], set[tuple[str, int, int]], Counter[str]]:
    """Dead letters on the topic per reason header, the (topic, partition, offset) each names
    as its source, and the letters per request id (field `key` of the original event)."""
    reasons: Counter[str] = Counter()
    sources = set()
    requests: Counter[str] = Counter()
    for value, headers in read_topic(kafka, topic):
        reasons[headers.get("reason", b"?").decode(errors="replace")] += 1
        if "source_topic" in headers:
            sources.add((headers["source_topic"].decode(), int(headers["source_partition"]),
                         int(headers["source_offset"])))
        if (request := request_of(value, key)) is not None:
            requests[request] += 1
    return reasons, sources, requests


# ----------------------------------------------------------------------------- one phase
def _rows(database_url: str, sql: str, params: tuple) -> list[tuple]:
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


@dataclass(frozen=True)
class PhaseRun:
    """What the harness knows of one phase when the figures are computed."""

    run_id: str
    load: Load
    injection: Injection
    ai_limit: int  # concurrency limit per AI endpoint
    allowed_dead_letters: Mapping[str, int | None]
    pipeline: str = pipeline_spec.REFERENCE
    poison: Poison | None = None  # requests the pipeline fails by design


def collect(database_url: str, kafka: KafkaConnection, phase: PhaseRun, service_stats: Mapping[str, Any],
            baseline_s: float, window_s: float) -> PhaseFigures:
    """Every figure of one phase (see the module docstring and bench/figures.py)."""
    spec = pipeline_spec.load(phase.pipeline)
    topics = Topics(phase.run_id, spec)
    load, injection = phase.load, phase.injection
    shared = figures.scenario_figures(database_url, kafka, phase.run_id, topics, load.produced,
                                      phase.ai_limit)
    times = shared["completion_times"]
    pre, recovery = recovery_s(times, injection.start, injection.end, load.ended, baseline_s, window_s)
    table = reasons_by_code(_rows(database_url, "SELECT reason, count(*) FROM dead_letters "
                                  "WHERE run_id = %s GROUP BY 1", (phase.run_id,)))
    table_sources = set(_rows(database_url, "SELECT source_topic, kafka_partition, kafka_offset "
                              "FROM dead_letters WHERE run_id = %s", (phase.run_id,)))
    topic_reasons, topic_sources, topic_requests = dead_letter_topic(kafka, topics.dead_letter, spec.key)
    dead_lettered = table_sources | topic_sources
    injected_lost: list[InjectedRecord] = [r for r in injection.records if r not in dead_lettered]
    recorded_twice = {row[0] for row in _rows(
        database_url, "SELECT DISTINCT d.request_id FROM dead_letters d JOIN stage_results s "
        "USING (pipeline, request_id, stage) WHERE d.run_id = %s", (phase.run_id,))}
    told_twice, resent = notification_outcomes(notifications(kafka, topics.name("notify")))
    unrecorded = _rows(database_url, "SELECT count(*) FROM requests WHERE run_id = %s AND entries < %s",
                       (phase.run_id, len(spec.entry_stages)))[0][0]
    service = {name: {k: service_stats[name][k] for k in SERVICE_COUNTERS}
               for name in spec.endpoints}
    outputs = committed_outputs(kafka, topics)
    poison = None
    if phase.poison is not None:
        measured = [json.loads(value)[spec.key]
                    for value, _ in read_topic(kafka, topics.name(spec.load.measure)) if value]
        letters = _rows(database_url, "SELECT request_id, reason FROM dead_letters WHERE run_id = %s",
                        (phase.run_id,))
        completed = {r for (r,) in _rows(database_url, "SELECT request_id FROM requests WHERE run_id = %s "
                                         "AND status = 'completed'", (phase.run_id,))}
        poison = poison_outcomes(measured, phase.poison, letters, topic_requests, completed)
    return PhaseFigures(
        completed=shared["completed"],
        status=shared["status"],
        dead_letters={"table": dict(table), "topic": dict(topic_reasons)},
        unexpected_dead_letters=unexpected_dead_letters(table, topic_reasons, phase.allowed_dead_letters),
        lost=shared["lost"] + len(injected_lost),
        injected_lost=injected_lost,
        intake_unrecorded=unrecorded,
        duplicate_results=len(recorded_twice | told_twice),
        resent_notifications=resent,
        outputs_read_committed=outputs,
        duplicate_outputs=sum(o["duplicates"] for o in outputs.values()),
        duplicate_ai_calls=shared["duplicate_ai_calls"],
        service=service,
        service_duplicates=sum(s["duplicate_served"] for s in service.values()),
        service_hangs=sum(s["hangs"] for s in service.values()),
        uncommitted={stage: group_uncommitted(kafka, topics.group_of(stage), topics.source_of(stage))
                     for stage in spec.stages},
        pre_fault_rps=round(pre, 2),
        fault_rps=(round(rate_between(times, injection.start, injection.end), 2)
                   if injection.end > injection.start else None),
        longest_stall_s=round(longest_stall_s(times, injection.start, load.ended), 1),
        recovery_s=recovery,
        steady_throughput_rps=shared["steady_throughput_rps"],
        rebalances=shared["rebalances"],
        p99_ms=shared["p99_ms"],
        completions_per_second=per_second(times, load.started),
        poison=poison,
    )
