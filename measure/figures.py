"""Every figure of a pipeline run, defined once.

The gate (from the Spark analysis), the benchmark (from SQL and Kafka offsets), the report and
the UI all take their figures from here: each side fetches the raw aggregates its own way
(`spark/pipeline_analysis.py` with DataFrames, `consumers/runs/run_figures.py` with SQL) and this module
turns them into figures, so a figure cannot mean two things.

- settled: a request whose status is one of TERMINAL.
- span_s: first request produced (`requests.produced_at`) -> last terminal state (the latest of
  a completed or rejected request's `finished_at` and a dead-lettered one's dead letter).
- throughput_rps: completed requests / span_s.
- steady_throughput_rps: completions per second on the plateau: the least-squares slope of the
  completion count against time over the completions between the 20th and 80th percentile
  (final-stage results, `stage_results.completed_at`); no ramp-up, no tail.
- service_s: per AI stage, the mean seconds of its successful calls ('ok' attempts, sent ->
  ended): what one call occupies of an endpoint's slot.
- calls_per_request: per AI stage, its successful calls (of every request) / completed requests.
- capacity_rps, binding_limit, capacity_candidates: the binding limit over every endpoint's
  concurrency and per-minute budgets, in completed requests/s (measure/capacity.py);
  bottleneck_stage: the AI stage that calls the binding endpoint.
- utilization: the share of the binding limit used inside the steady band, counted on the
  binding endpoint's calls (measure/capacity.py); in expectation steady_throughput_rps /
  capacity_rps.
- latency p50/p95/p99 (ms): completed requests, `produced_at` -> `notified_at` (the result
  reached the user), linear interpolation between the two closest ranks (PostgreSQL's
  `percentile_cont`, Spark's `percentile`).
- objective figures, for a pipeline that declares a latency objective (a latency within
  `objective_s`, for at least `objective_share` of its requests): within_objective, the
  completed requests whose end-to-end latency (as above) is at most objective_s;
  share_within_objective, of the completed; goodput_rps, within_objective / span_s: the
  requests per second that met it, as vLLM's `bench serve` and AIPerf give goodput.
- lost: requests produced (per the source) that never settled.
- duplicate_ai_calls: AI calls the provider may have billed again: billed tries
  (measure.cost.billed: answered, abandoned by a timeout, cut short by a crash) beyond the first
  per (request, stage); the paid-twice calls of measure.cost, and what the provider counts as
  requests served more than once.
- duplicate outputs: events a `read_committed` reader of a topic the stages write sees beyond
  the first per (request, kind): a route's message delivered twice.
- skew over a topic's partitions (records per partition, empty partitions included): max/mean
  and coefficient of variation (population standard deviation / mean), the Gini coefficient
  (2 * sum(i * x_i) / (n * sum(x)) - (n + 1) / n, x ascending, i from 1: 0 for an even load,
  (n - 1) / n with everything on one partition) and the hottest partition's share of the
  records (ties go to the lowest partition); None for a topic without records. A partition is
  hot when its records exceed a threshold x the topic's mean.
- hashing skew bound: the max/mean that uniform key hashing of `records` over `partitions`
  exceeds with probability at most 0.001 (union bound over the partitions of Binomial(records,
  1/partitions)'s upper tail): below it, skew is what a sample of that size looks like.
- consumer lag of a group on a partition: records past its committed offset (past the low
  watermark when it committed nothing); a pipeline's lag sums its stages' groups.
- lag trend: the least-squares slope of lag samples against time (records/s): a pipeline keeps
  up with a steady rate when the trend stays near 0, and falls behind by the trend otherwise.

Against the physical limits, where the AI service's capacity may change during a run (a
schedule: (from_s, capacity_rps) pieces, seconds since the first produce):
- physical_minimum_s: the shortest span the AI services allow: the longest, over every limit of
  measure.capacity, of the AI calls before that limit's endpoint on a request's path (its first
  call waits for them), then `requests` through the limit, then the AI calls after it (the last
  request still goes through them); the chains at the spec's mean latencies
  (PipelineSpec.chain_around). Through a concurrency, requests / the capacity in force already
  holds every call of the endpoint (slots x seconds is what they occupy), so its own call is not
  added again: 1280 requests through generate's 64 slots of 3 s are 60 s, after check's 0.5 s,
  60.5 s in all (not 60 + the whole path's 3.5 s). A budget admits its allowance at once and the
  rest at its rate (measure.capacity), and its last call still takes its mean time after its
  admission. The longest over the limits rather than the binding one's: each is a bound no run
  can beat, and a schedule may move which limit binds. Under heavy tails the first and last
  requests may beat the mean chains, by less than a chain.
- span_over_minimum: span_s / physical_minimum_s.
- utilization_in_force: the share of the concurrency in force that the bottleneck's successful
  calls kept busy on the plateau (from the first to the last completion of the STEADY_BAND, as
  for steady_throughput_rps): seconds of those calls inside it / the slot-seconds the
  concurrency in force gives it, calls beyond it at any instant not counted (the caller times
  a call with its way there and back, which the service does not hold). It counts calls, not
  completions: with calls of a fixed latency completions come in waves, and where the band's
  ends fall among the waves moves a count of completions by up to a wave, whatever the slots'
  use (docs/benchmarks.md, Utilization).
- recovery_s after a change of capacity: from the change until the completions of the last
  `window_s` (one call of the bottleneck: as many completions as calls fit in flight) first
  reach RECOVERED of what the new capacity serves in that window.
- overload_share: 429 answers / calls, as the AI service counts them.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from measure import capacity as capacity_of

TERMINAL = ("completed", "rejected", "dead_lettered")
QUANTILES = (0.5, 0.95, 0.99)
STEADY_BAND = (0.2, 0.8)  # completion percentiles bounding the plateau
RECOVERED = 0.9  # share of the new capacity that ends a recovery
MIN_STEADY_POINTS = 10


def settled(statuses: Mapping[str, int]) -> int:
    """Requests in a terminal status."""
    return sum(statuses.get(s, 0) for s in TERMINAL)


def lost(produced: int, statuses: Mapping[str, int]) -> int:
    return produced - settled(statuses)


def span_s(first_produced_s: float | None, last_terminal_s: float | None) -> float | None:
    if first_produced_s is None or last_terminal_s is None:
        return None
    return last_terminal_s - first_produced_s


def throughput_rps(completed: int, span: float | None) -> float:
    return completed / span if span and span > 0 else 0.0


def steady_band(times: Sequence[float]) -> tuple[float, float] | None:
    """The plateau: from the STEADY_BAND's first to its last completion; None with fewer than
    MIN_STEADY_POINTS completions."""
    if len(times) < MIN_STEADY_POINTS:
        return None
    ordered = sorted(times)
    lo, hi = (round(share * (len(ordered) - 1)) for share in STEADY_BAND)
    return ordered[lo], ordered[hi]


def steady_rate(times: Sequence[float]) -> float:
    """Completions per second on the plateau (see the module docstring).

    A slope rather than count / span: completions come in waves (slots that started together
    finish together), and a span whose ends fall inside waves is off by up to a wave.
    """
    if len(times) < MIN_STEADY_POINTS:
        return 0.0
    lo, hi = (round(share * (len(times) - 1)) for share in STEADY_BAND)
    window = sorted(times)[lo:hi + 1]
    if window[-1] <= window[0]:
        return 0.0
    return statistics.linear_regression(window, range(lo, hi + 1)).slope


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile with linear interpolation between the closest ranks (percentile_cont)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    below = math.floor(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (rank - below)


def beyond_first(counts: Iterable[int]) -> int:
    """Occurrences beyond the first of each thing counted: duplicate AI calls from the
    billed tries per (request, stage), duplicate outputs from the events per (topic,
    request, kind)."""
    return sum(n - 1 for n in counts if n > 1)


def objective_figures(objective_s: float, objective_share: float, completed: int, within: int,
                      span: float | None) -> dict[str, Any]:
    """A latency objective's figures of a run (see the module docstring): `within` of its
    `completed` requests met `objective_s`. The share is None when nothing completed."""
    if not 0 <= within <= completed:
        raise ValueError(f"{within} requests within the objective of {completed} completed")
    return {"objective_s": objective_s, "objective_share": objective_share, "within_objective": within,
            "share_within_objective": _round(within / completed, 4) if completed else None,
            "goodput_rps": round(throughput_rps(within, span), 3)}


def skew(counts: Sequence[int]) -> tuple[float | None, float | None]:
    """(max/mean, coefficient of variation) of per-partition counts; None without records."""
    mean = statistics.fmean(counts) if counts else 0.0
    if mean == 0:
        return None, None
    return max(counts) / mean, statistics.pstdev(counts) / mean


def gini(counts: Sequence[int]) -> float | None:
    """Gini coefficient of per-partition counts; None without records."""
    total = sum(counts)
    if total == 0:
        return None
    n = len(counts)
    weighted = sum(i * x for i, x in enumerate(sorted(counts), start=1))
    return 2 * weighted / (n * total) - (n + 1) / n


def hottest(counts: Sequence[int]) -> tuple[int | None, float | None]:
    """(index, share of all records) of the partition with the most records; None without records."""
    total = sum(counts)
    if total == 0:
        return None, None
    index = max(range(len(counts)), key=lambda i: (counts[i], -i))
    return index, counts[index] / total


def hot_partitions(counts: Sequence[int], threshold: float) -> list[int]:
    """Indexes of the partitions whose counts exceed `threshold` x the mean count."""
    mean = statistics.fmean(counts) if counts else 0.0
    return [i for i, n in enumerate(counts) if n > threshold * mean]


def hashing_skew_bound(records: int, partitions: int, alpha: float = 0.001) -> float:
    """The max/mean that `records` keys hashed uniformly over `partitions` exceed with
    probability at most `alpha`: c / mean for the least c with partitions x P(X >= c) <= alpha,
    X ~ Binomial(records, 1/partitions). 160 requests over 16 partitions reach 2.1 by chance;
    a burst a sticky partitioner put on few partitions is far beyond it."""
    if records <= 0 or partitions <= 1:
        return 1.0
    p = 1 / partitions

    def log_pmf(j: int) -> float:
        return (math.lgamma(records + 1) - math.lgamma(j + 1) - math.lgamma(records - j + 1)
                + j * math.log(p) + (records - j) * math.log1p(-p))

    # P(X >= c), summed from the top down, from 12 standard deviations above the mean: the
    # tail beyond it is below 1e-30, and a run of millions of records needs no million terms.
    tail = 0.0
    c = min(records, math.ceil(records * p + 12 * math.sqrt(records * p * (1 - p)))) + 1
    while c > 0 and tail + math.exp(log_pmf(c - 1)) <= alpha / partitions:
        c -= 1
        tail += math.exp(log_pmf(c))
    return min(c, records) / (records / partitions)


def consumer_lag(low: int, high: int, committed: int) -> int:
    """Records of one partition past the group's committed offset (negative: nothing committed)."""
    return high - (committed if committed >= 0 else low)


def lag_trend(samples: Sequence[tuple[float, float]]) -> float:
    """Slope of (time s, lag) samples, records per second; 0 with fewer than 2 instants."""
    if len({t for t, _ in samples}) < 2:
        return 0.0
    return statistics.linear_regression([t for t, _ in samples], [lag for _, lag in samples]).slope


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def run_figures(*, produced: int, status: Mapping[str, int], span: float | None,
                steady_throughput_rps: float, service_s: Mapping[str, float], ai_limit: int,
                ok_calls: Mapping[str, int], band_work: Mapping[str, capacity_of.BandWork],
                band: tuple[float, float] | None, duplicate_ai_calls: int,
                skew_max_over_mean: float | None, skew_cv: float | None,
                latency_s: Mapping[float, float | None], skew_records: int = 0,
                skew_partitions: int = 0, limits: capacity_of.Limits | None = None) -> dict[str, Any]:
    """The standard figures of one run from its aggregates (span from `span_s`, steady
    throughput from `steady_rate`, the band from `steady_band` and the work inside it from
    capacity.band_work, ok_calls: successful calls per AI stage, latency_s: quantile -> seconds;
    the skew's records and partitions give its hashing bound, None when not given). `limits`:
    the endpoints' limits; by default one endpoint per AI stage at `ai_limit`."""
    completed = status.get("completed", 0)
    limits = limits or capacity_of.Limits.uniform(ai_limit, sorted({*service_s, *ok_calls}))
    calls = capacity_of.calls_per_request(ok_calls, completed)
    cap = capacity_of.capacity(limits, service_s, calls)
    binding = cap.binding.endpoint if cap.binding else None
    used = capacity_of.utilization(cap, limits, band_work, band)
    return {
        "produced": produced,
        "completed": completed,
        "status": dict(status),
        "lost": lost(produced, status),
        "span_s": _round(span, 3),
        "throughput_rps": round(throughput_rps(completed, span), 3),
        "steady_throughput_rps": round(steady_throughput_rps, 3),
        "service_s": {stage: round(s, 5) for stage, s in sorted(service_s.items())},
        "calls_per_request": {stage: round(c, 4) for stage, c in sorted(calls.items())},
        "ai_limit": ai_limit,
        "bottleneck_stage": next((s for s, e in sorted(limits.stage_endpoint.items())
                                  if e == binding and s in calls), None),
        "binding_limit": cap.binding_limit,
        "capacity_rps": _round(cap.rps, 3),
        "capacity_candidates": cap.as_dict()["candidates"],
        "utilization": _round(used, 4),
        "duplicate_ai_calls": duplicate_ai_calls,
        "skew_max_over_mean": _round(skew_max_over_mean, 3),
        "skew_cv": _round(skew_cv, 3),
        "skew_hashing_bound": round(hashing_skew_bound(skew_records, skew_partitions), 3)
        if skew_records and skew_partitions else None,
        **{f"p{round(q * 100)}_ms": _round(None if (at_q := latency_s.get(q)) is None else at_q * 1000, 1)
           for q in QUANTILES},
    }


def from_analysis(document: Mapping[str, Any], *, produced: int, ai_limit: int,
                  skew_max_over_mean: float | None, skew_cv: float | None, skew_records: int = 0,
                  skew_partitions: int = 0, limits: capacity_of.Limits | None = None) -> dict[str, Any]:
    """run_figures of a run from the Spark analysis' document (spark/pipeline_analysis.py) and
    its style topic's skew (spark/partition_load.py): what the gate decides on."""
    latency = document["latency_s"]["end_to_end"].get("notified", {})
    band = document["steady_band"]
    return run_figures(
        produced=produced, status=document["status"], span=document["span_s"],
        steady_throughput_rps=document["steady_throughput_rps"], service_s=document["service_s"],
        ai_limit=ai_limit, ok_calls=document["ok_calls"],
        band_work={stage: capacity_of.BandWork(**w) for stage, w in document["band_work"].items()},
        band=tuple(band) if band else None, duplicate_ai_calls=document["duplicates"]["total"],
        skew_max_over_mean=skew_max_over_mean, skew_cv=skew_cv, skew_records=skew_records,
        skew_partitions=skew_partitions, latency_s={q: latency.get(f"p{round(q * 100)}") for q in QUANTILES},
        limits=limits)


Schedule = Sequence[tuple[float, float]]  # (from_s, capacity_rps), in time order, the first from 0


def capacity_at(schedule: Schedule, t: float) -> float:
    return [rps for at, rps in schedule if t >= at][-1] if t >= schedule[0][0] else schedule[0][1]


def servable(schedule: Schedule, start: float, end: float) -> float:
    """The schedule summed over time between `start` and `end`: the requests a capacity schedule
    can serve, the slot-seconds a concurrency schedule gives."""
    bounds = [start, *(at for at, _ in schedule if start < at < end), end]
    return sum(capacity_at(schedule, a) * (b - a) for a, b in itertools.pairwise(bounds))


def physical_minimum_s(requests: float, schedule: Schedule, before_s: float = 0.0, after_s: float = 0.0,
                       allowance: float = 0.0) -> float:
    """The shortest span one limit allows (see the module docstring): from `before_s`,
    `allowance` requests at once, the rest at the schedule in force (requests/s), then
    `after_s`; the schedule's last piece holds until the end."""
    left = max(0.0, requests - allowance)
    served, at = 0.0, before_s
    pieces = [(max(start, before_s), rps) for start, rps in schedule]
    for (start, rps), (end, _) in itertools.pairwise([*pieces, (math.inf, 0.0)]):
        if served >= left:
            break
        if end <= start or rps <= 0:
            at = max(at, end)  # a piece over before the limit's first call, or serving nothing
            continue
        if served + rps * (end - start) >= left:
            return start + (left - served) / rps + after_s
        served, at = served + rps * (end - start), end
    return at + after_s


def physical_minimum(requests: int, limits: capacity_of.Limits, service_s: Mapping[str, float],
                     calls: Mapping[str, float], chains: Mapping[str, tuple[float, float]],
                     endpoint: str | None = None, concurrency: Sequence[tuple[float, int]] = ()
                     ) -> tuple[float, str] | None:
    """(physical_minimum_s, the limit giving it) over every measured limit (see the module
    docstring); `chains`: per endpoint, the seconds of AI calls before and after its call on a
    request's path; `endpoint`'s concurrency follows `concurrency`, (from_s, slots), when given."""
    found = []
    for c, schedule in capacity_of.limit_schedules(limits, service_s, calls, endpoint, concurrency):
        before, after = chains.get(c.endpoint, (0.0, 0.0))
        if c.dimension != "concurrency":  # a budget admits the last call; it still takes its time
            after += capacity_of.mean_call_s(limits, service_s, calls, c.endpoint)
        found.append((physical_minimum_s(requests, schedule, before, after, c.allowance), c.name))
    return max(found) if found else None


def span_over_minimum(span: float | None, minimum_s: float) -> float | None:
    return None if span is None or minimum_s <= 0 else span / minimum_s


def utilization_in_force(times: Sequence[float], calls: Iterable[tuple[float, float]],
                         limits: Schedule) -> float | None:
    """Completion times, the successful calls' (start, end) and `limits` (the concurrency in
    force, calls) are in seconds since the first produce."""
    band = steady_band(times)
    if band is None:
        return None
    start, end = band
    # Calls in flight, counted at most up to the slots in force at each instant: a call is
    # timed by its caller, from its send to its answer's arrival, so the calls on their way
    # there and back overlap the ones the service holds, and summed plainly they read a full
    # service above 1 (docs/design.md#utilisation-counts-no-more-calls-than-the-slots-in-force).
    edges = sorted([(max(a, start), 1) for a, b in calls if b > start and a < end]
                   + [(min(b, end), -1) for a, b in calls if b > start and a < end]
                   + [(at, 0) for at, _ in limits if start < at < end])
    busy, active, at = 0.0, 0, start
    for t, step in edges:
        busy += min(active, capacity_at(limits, at)) * (t - at)
        active, at = active + step, t
    slots = servable(limits, start, end)
    return busy / slots if slots > 0 else None


def recovery_s(times: Sequence[float], change_at: float, capacity_rps: float,
               window_s: float) -> float | None:
    """See the module docstring; None when the completions never get there."""
    ordered = sorted(times)
    for t in (t for t in ordered if t >= change_at):
        recent = bisect.bisect_right(ordered, t) - bisect.bisect_right(ordered, t - window_s)
        if recent >= RECOVERED * capacity_rps * window_s:
            return t - change_at
    return None


def overload_share(refused: int, calls: int) -> float | None:
    return refused / calls if calls else None
