"""A run's figures from what the pipeline recorded in PostgreSQL and Kafka.

The standard figures (throughput, steady throughput, capacity, utilization, latency, lost,
duplicate AI calls, skew), defined in `measure.figures`, come from the runtime's SQL side
(`consumers/runs/run_figures.py`), with requests per partition from the style topic's offsets (or
where the source saw them land, when the topic holds more than one phase); the
Spark analysis computes the same figures and a test checks that both agree on the same run.
Benchmark-only figures:

- rebalances: revoke/lost/max-poll-exceeded events between the first request produced and the
  last terminal state: rebalances after the initial assignment, before shutdown.
- overhead_p99_ms: end-to-end latency (as measure.figures defines it) minus the request's AI
  time along its path (its 'ok' attempts' seconds per stage, summed along the routes, the
  slowest branch where stages fan out: PipelineSpec.path_s), i.e. what the platform added.
- stage_latency, per AI stage: p50 and p99 of its 'ok' calls, in ms.
- busiest_partition, per AI stage: the partition whose 'ok' AI calls add up to the most seconds,
  with its request count and those seconds. A consumer with one request in flight per
  partition cannot finish before that partition's AI time has passed, so set beside span_s
  it shows whether that partition bounded the run.
- refetch_amplification: bytes librdkafka received for the AI stages' topics (its statistics
  count re-fetched data) / bytes of distinct records on those topics.
- cost (measure.cost, from the attempt rows): tokens and cost per completed request, cost per
  1,000 completed requests, and what the failed and the paid-twice calls cost; "unknown" where
  no gateway reported a cost and the spec declares no prices.
- physical_minimum_s (and minimum_limit, the limit giving it), span_over_minimum,
  overload_share (measure.figures): the completed requests through each limit (measure.capacity
  with this run's mean calls and calls per request, the concurrency of the scheduled endpoint
  following its schedule, a budget's bucket starting full), with the AI calls around that
  limit's endpoint on a request's path at the spec's mean latencies (PipelineSpec.chain_around),
  the longest over the limits.
- overload_by_endpoint: per AI endpoint, its tries and those answered 429 (the attempt rows:
  a gateway's refusals too), and their share.
- served_on_binding: what the stand-in's own counters say of the binding endpoint: its `served`
  calls per second over the span beside the calls per second the binding limit allows there
  (measure.capacity.served_check), set beside the utilization, which is counted on our calls
  inside the steady band. The counters are totals since the burst began, so the span is the
  window they can give.
- for a limit that changes during the run (`adaptive`): the limit the fleet discovered (its
  `ai_limits` rows) beside the one the service had in force, utilization_in_force and a
  recovery_s per change (measure.figures), against the capacity with the bottleneck's measured
  mean call; the per-minute budgets the fleet learned from the answers (its `ai_budgets` rows)
  beside a gateway's, and when the bottleneck's successful calls ended.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from consumers.config.events import Topics
from consumers.config.kafka_connection import KafkaConnection
from consumers.config.pipeline_spec import PipelineSpec
from consumers.config.presets import PresetParams
from consumers.runs.run_figures import cost_figures, limits_of, rows, standard_figures
from consumers.stand_in.endpoint import REFUSALS
from measure import capacity, figures

POLL_S = 0.2  # the longest one read of topic_bytes waits
BUDGET_SETTINGS = ("requests_per_minute", "tokens_per_minute", "tokens")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def busiest_partitions(calls: list[tuple[str, int, float]]) -> dict[str, dict[str, Any]]:
    """Per stage, the partition with the most 'ok' AI seconds (see the module docstring)."""
    load: dict[tuple[str, int], list[float]] = defaultdict(list)
    for stage, partition, seconds in calls:
        load[(stage, partition)].append(seconds)
    busiest: dict[str, dict[str, Any]] = {}
    for (stage, partition), seconds in sorted(load.items()):
        if stage not in busiest or sum(seconds) > busiest[stage]["ai_s"]:
            busiest[stage] = {"partition": partition, "requests": len(seconds), "ai_s": sum(seconds)}
    return {stage: {**b, "ai_s": round(b["ai_s"], 3)} for stage, b in busiest.items()}


def refetch_amplification(database_url: str, kafka: KafkaConnection, run_id: str,
                          topics: Topics) -> float | None:
    """Fetched bytes (last statistics of each AI stage's member) / bytes of the AI stages' input
    records."""
    ai_stages = topics.spec.ai_stages
    stats = rows(database_url, "SELECT DISTINCT ON (member) stats FROM client_stats WHERE run_id = %s "
                 "AND split_part(member, '-', 1) = ANY(%s) ORDER BY member, at DESC",
                 (run_id, list(ai_stages)))
    fetched = sum(r[0]["rxbytes"] for r in stats)
    unique = sum(topic_bytes(kafka, topics.source_of(stage)) for stage in ai_stages)
    return round(fetched / unique, 4) if unique and fetched else None


def topic_bytes(kafka: KafkaConnection, topic: str, timeout_s: float = 60.0) -> int:
    """Key + value bytes of every record of a topic (read once, from the beginning)."""
    consumer = Consumer(kafka.client(**{"group.id": "figures-bytes", "enable.auto.commit": False}))
    try:
        return sum(len(msg.value() or b"") + len(msg.key() or b"")
                   for msg in read_to_end(consumer, topic, timeout_s=timeout_s))
    finally:
        consumer.close()


def read_to_end(consumer: Consumer, topic: str, starts: Mapping[int, int] | None = None,
                timeout_s: float = 60.0) -> list[Message]:
    """The records of `topic` from `starts` (partition -> offset; default: every partition from
    its beginning) up to the high watermarks as they were when the read began.

    The read ends when the consumer's position reaches each partition's high watermark, not
    after as many records as the offsets span: a topic written in transactions holds a marker
    per transaction and partition, which takes an offset and is no record. Each read waits at
    most POLL_S: `consume` holds out for its whole timeout until it has `num_messages`, so a
    long timeout cost every scenario 5 s a stage for a topic of a few thousand records. A topic
    not read to its end within `timeout_s` raises rather than give a figure over part of it.
    """
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    starts = starts if starts is not None else dict.fromkeys(partitions, OFFSET_BEGINNING)
    ends = {}
    for p, start in starts.items():
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        if high > max(low, start):
            ends[p] = high
    consumer.assign([TopicPartition(topic, p, starts[p]) for p in ends])
    records: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while ends:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}: partitions {sorted(ends)} not read to their end in "
                               f"{timeout_s:.0f} s")
        fetched = consumer.consume(num_messages=10_000, timeout=POLL_S)
        records += [msg for msg in fetched if msg.error() is None]
        for position in consumer.position([TopicPartition(topic, p) for p in ends]):
            if position.offset >= ends[position.partition]:
                del ends[position.partition]
    return records


def overhead_ms(extras: dict[str, Any], q: float, spec: PipelineSpec) -> float | None:
    """The q-quantile of end-to-end latency minus the request's AI time along its path, in ms."""
    return _ms(figures.percentile([e2e - spec.path_s(ai) for e2e, ai in extras["latency"] if ai], q))


def bench_limits(p: PresetParams, service: Mapping[str, Mapping[str, Any]] | None = None,
                 gateway: Mapping[str, Mapping[str, int]] | None = None) -> capacity.Limits:
    """The endpoints' limits in a benchmark run: the spec's budgets, the run's concurrency for each
    endpoint (the stand-in is configured so), its time scale, the budgets of a gateway in front
    of an endpoint (`gateway`, in the run's minutes: bench.run's Stack.gateway_budgets), and the
    tokens per call of the kind each tokens budget counts where the stand-in's counters
    (`/v1/stats`) have them."""
    tokens = {}
    limits = limits_of(p.spec, p.concurrency, p.time_scale)
    endpoints = dict(limits.endpoints)
    for name in p.spec.endpoints:
        counted = (service or {}).get(name, {})
        # The budgets in force are the stand-in's (a run may set them over the spec's).
        config = {**p.endpoint_settings.get(name, {}), **counted.get("config", {}),
                  **(gateway or {}).get(name, {})}
        budgets = replace(endpoints[name], **{k: config[k] for k in BUDGET_SETTINGS if k in config})
        if (gateway or {}).get(name):  # the gateway's fixed windows, not the stand-in's buckets
            budgets = capacity.fixed_periods(budgets, p.time_scale)
        endpoints[name] = budgets
        if budgets.tokens_per_minute and "tokens_input" in counted and "tokens_output" in counted:
            per_call = capacity.tokens_per_call(budgets.tokens, counted.get("served", 0),
                                                counted["tokens_input"], counted["tokens_output"])
            if per_call is not None:
                tokens[name] = per_call
    return replace(limits, endpoints=endpoints, tokens_per_call=tokens)


def phase_figures(database_url: str, run_id: str, topics: Topics, produced: int, ai_limit: int,
                  per_partition: list[int], limits: capacity.Limits | None = None) -> dict[str, Any]:
    """The standard figures of one phase of a scenario (its own run id) and its overhead;
    `limits` by default the spec's with `ai_limit` for every endpoint (bench_limits adds the time
    scale the budgets need)."""
    standard, extras = standard_figures(database_url, run_id, topics.spec.completing_stage, produced,
                                        ai_limit, per_partition, limits or limits_of(topics.spec, ai_limit))
    return {"run_id": run_id, **standard, "overhead_p50_ms": overhead_ms(extras, 0.5, topics.spec),
            "overhead_p99_ms": overhead_ms(extras, 0.99, topics.spec)}


def scenario_figures(database_url: str, kafka: KafkaConnection, run_id: str, topics: Topics, produced: int,
                     ai_limit: int, per_partition: list[int] | None = None,
                     limits: capacity.Limits | None = None) -> dict[str, Any]:
    """Every figure of one scenario run: the standard ones and the benchmark's own.
    `per_partition`: the run's requests per partition of the measured topic as the source saw
    them land, when the topic also holds another phase's; by default the topic's offsets."""
    if per_partition is None:
        per_partition = kafka.partition_counts(topics.name(topics.spec.load.measure))
    standard, extras = standard_figures(database_url, run_id, topics.spec.completing_stage, produced,
                                        ai_limit, per_partition, limits or limits_of(topics.spec, ai_limit))
    first, last = extras["first_produced_s"], extras["last_terminal_s"]
    rebalances = rows(database_url, "SELECT count(*) FROM rebalance_events WHERE run_id = %s AND "
                       "event IN ('revoke', 'lost', 'max_poll_exceeded') AND at BETWEEN "
                       "to_timestamp(%s) AND to_timestamp(%s)", (run_id, first, last))[0][0]
    return {
        "run_id": run_id,
        **standard,
        "rebalances": rebalances,
        "requests_per_partition": per_partition,
        "overhead_p99_ms": overhead_ms(extras, 0.99, topics.spec),
        "stage_latency": {stage: {"p50_ms": _ms(figures.percentile(s, 0.5)),
                                  "p99_ms": _ms(figures.percentile(s, 0.99))}
                          for stage, s in sorted(extras["per_stage"].items())},
        "busiest_partition": busiest_partitions(extras["calls"]),
        "refetch_amplification": refetch_amplification(database_url, kafka, run_id, topics),
        "cost": cost_figures(database_url, run_id, standard["completed"], topics.spec),
        "first_produced_s": first,
        "completion_times": extras["completion_times"],
    }


def _relative(schedule: list[list[float]], p: PresetParams, applied_at: float,
              first_produced: float) -> list[tuple[float, float]]:
    """A stand-in limit schedule (real-scale seconds since `applied_at`) as (seconds since the first
    produce, limit)."""
    return [(at * p.time_scale + applied_at - first_produced, limit) for at, limit in schedule]


def limit_figures(result: dict[str, Any], p: PresetParams, schedule: list[list[float]],
                  applied_at: float, gateway: Mapping[str, Mapping[str, int]] | None = None,
                  gateway_refused: int = 0) -> dict[str, Any]:
    """The span against the physical minimum, the share of calls refused with 429, and the
    stand-in's served calls on the binding endpoint (see the module docstring); `gateway` as
    for bench_limits, `gateway_refused` the 429s a gateway in front of the stand-in gave (the
    stand-in never saw those calls)."""
    limits = bench_limits(p, result["ai_service"], gateway)
    service_s, calls = result["service_s"], result["calls_per_request"]
    first = result["first_produced_s"] or applied_at
    concurrency = [(max(0.0, at), int(limit)) for at, limit in _relative(schedule, p, applied_at, first)]
    chains = {}
    for name in p.spec.endpoints:
        before, after = p.spec.chain_around(name)
        chains[name] = (before * p.time_scale, after * p.time_scale)
    found = figures.physical_minimum(result["completed"], limits, service_s, calls, chains,
                                     p.bottleneck, concurrency) if calls else None
    minimum, minimum_limit = found if found else (None, None)
    service = result["ai_service"].values()
    refused = gateway_refused + sum(e[kind] for e in service for kind in REFUSALS)
    calls_made = refused + sum(e["served"] + e["errors_5xx"] + e["hangs"] for e in service)
    share = figures.overload_share(refused, calls_made)
    binding = capacity.capacity(limits, service_s, calls)
    served = result["ai_service"].get(binding.binding.endpoint, {}).get("served") if binding.binding else None
    return {"physical_minimum_s": _rounded(minimum, 3), "minimum_limit": minimum_limit,
            "span_over_minimum": None if minimum is None else _rounded(
                figures.span_over_minimum(result["span_s"], minimum), 4),
            "ai_calls": calls_made, "ai_429": refused, "overload_share": _rounded(share, 5),
            "served_on_binding": capacity.served_check(binding, calls, limits, served, result["span_s"])}


def refused_at_client(database_url: str, run_id: str, stages: list[str]) -> int:
    """The tries of `stages` answered 429 in a run, as the attempt rows have them: a gateway's
    refusals, which the stand-in behind it never counts."""
    return int(rows(database_url, "SELECT count(*) FROM ai_attempts WHERE run_id = %s AND stage = ANY(%s) "
                    "AND outcome = 'http_429'", (run_id, stages))[0][0])


def overload_entry(refused: int, calls: int) -> dict[str, Any]:
    """One endpoint's 429s beside its calls, and their share (measure.figures.overload_share)."""
    share = figures.overload_share(refused, calls)
    return {"ai_calls": calls, "ai_429": refused, "overload_share": _rounded(share, 5)}


def overload_by_endpoint(database_url: str, run_id: str, spec: PipelineSpec) -> dict[str, dict[str, Any]]:
    """Per endpoint, the tries its stages sent and those answered 429, from the attempt rows: a
    gateway's refusals too, which the stand-in behind it never counts."""
    counts: dict[str, tuple[int, int]] = {}
    for stage, calls, refused in rows(
            database_url, "SELECT stage, count(*) FILTER (WHERE outcome <> 'not_sent'), "
            "count(*) FILTER (WHERE outcome = 'http_429') FROM ai_attempts WHERE run_id = %s GROUP BY stage",
            (run_id,)):
        endpoint = spec.stages[stage].work.endpoint
        made, seen = counts.get(endpoint, (0, 0))
        counts[endpoint] = (made + calls, seen + refused)
    return {name: overload_entry(refused, calls) for name, (calls, refused) in sorted(counts.items())}


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def adaptive_figures(database_url: str, run_id: str, result: dict[str, Any], p: PresetParams,
                     schedule: list[list[float]], applied_at: float,
                     gateway: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, Any]:
    """How the discovered limit followed the service's, and the budgets the fleet learned beside
    the gateway's (see the module docstring)."""
    stage = result["bottleneck_stage"]
    first = result["first_produced_s"]
    service_s = result["service_s"][stage]
    in_force = _relative([[0.0, p.concurrency], *schedule], p, applied_at, first)
    slots = [(max(0.0, at), float(limit)) for at, limit in in_force]
    times = [t - first for t in result["completion_times"]]
    discovered = [(float(at) - first, limit) for at, limit in rows(
        database_url, "SELECT extract(epoch FROM at), limit_value FROM ai_limits WHERE run_id = %s "
        "AND stage = %s ORDER BY at", (run_id, stage))]
    calls = [(float(started) - first, float(ended) - first) for started, ended in rows(
        database_url, "SELECT extract(epoch FROM started_at), extract(epoch FROM ended_at) FROM ai_attempts "
        "WHERE run_id = %s AND stage = %s AND outcome = 'ok'", (run_id, stage))]
    recoveries = []
    for at, limit in in_force[1:]:
        took = figures.recovery_s(times, at, limit / service_s, service_s)
        recoveries.append({"at_s": round(at, 3), "limit": limit, "recovery_s": _rounded(took, 3),
                           "recovery_real_s": _rounded(None if took is None else took / p.time_scale, 2)})
    utilization = figures.utilization_in_force(times, calls, slots)
    budgets = [(round(float(at) - first, 3), kind, per_minute, turned) for at, kind, per_minute, turned in
               rows(database_url, "SELECT extract(epoch FROM at), kind, per_minute, turned FROM ai_budgets "
                    "WHERE run_id = %s AND stage = %s ORDER BY at", (run_id, stage))]
    endpoint = p.spec.stages[stage].work.endpoint
    gateway_budgets = {kind.removesuffix("_per_minute"): budget / p.time_scale  # a wall-clock minute's
                       for kind, budget in (gateway or {}).get(endpoint, {}).items()}
    tokens_per_call = bench_limits(p, result["ai_service"], gateway).tokens_per_call.get(endpoint)
    return {"stage": stage, "service_s": round(service_s, 5),
            "utilization_in_force": _rounded(utilization, 4), "recoveries": recoveries,
            "service_limits": [(round(at, 3), limit) for at, limit in in_force],
            "discovered_limits": [(round(at, 3), limit) for at, limit in discovered],
            "discovered_budgets": budgets, "gateway_budgets": gateway_budgets,
            "tokens_per_call": _rounded(tokens_per_call, 3),
            "calls_ended": sorted(round(ended, 3) for _, ended in calls)}
