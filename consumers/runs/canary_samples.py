"""What each side of a canary did over one analysis window, read from the run's rows.

Both sides write under the live run; a row says which side handled it through its member
(`fleet_members`: the canary's fleets carry its id, the active group's none), which tells them
apart even when the candidate's configuration is the active one's (an identical candidate
registers as the same version). A side's requests in the window are those produced in it whose
changed stage it completed before the window closed: a partition handed over waits while it
changes hands, and the records it gathered meanwhile, produced before the window, would charge
that wait to the side that takes it. Their end-to-end latency runs from produced to notified (as
`measure.figures` defines it), so a request still on its way downstream when the window closes
is read once it arrives. Dead letters carry no member: they go to the side that held their
partition, which no hand-over moves inside a window. Tries are priced at the side's own spec's
prices (a candidate may call another endpoint), each billed try charged to its request as
`measure.cost` does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from consumers.config.candidate import PipelineConfig
from consumers.runs.run_figures import prices_of, rows
from measure import cost
from measure.canary import Timed, VersionSample

# Dead-letter reasons that are the call's failure, not the record's: the request failed for good.
ERROR_REASONS = ("ai_unavailable", "ai_bad_answer", "work_failed")

# Each side's results in the window, with their requests' end-to-end latency and AI seconds per
# stage: the window's requests only (by their key, indexed), not the whole live run's tries.
_RESULTS_SQL = """
SELECT f.canary IS NOT NULL, s.request_id, s.stage, s.kafka_partition, extract(epoch FROM r.produced_at),
       extract(epoch FROM r.notified_at - r.produced_at), ai.per_stage
FROM stage_results s JOIN fleet_members f USING (run_id, member)
JOIN requests r ON r.pipeline = s.pipeline AND r.request_id = s.request_id
LEFT JOIN LATERAL (
  SELECT json_object_agg(stage, ai_s) AS per_stage FROM (
    SELECT a.stage, sum(extract(epoch FROM a.ended_at - a.started_at)) AS ai_s FROM ai_attempts a
    WHERE a.pipeline = s.pipeline AND a.request_id = s.request_id AND a.run_id = s.run_id
      AND a.outcome = 'ok' GROUP BY a.stage) calls) ai ON true
WHERE s.run_id = %(run)s AND s.stage = ANY(%(stages)s) AND (f.canary IS NULL OR f.canary = %(canary)s)
  AND s.completed_at < to_timestamp(%(end)s) AND r.produced_at >= to_timestamp(%(start)s)
"""

_ATTEMPTS_SQL = """
SELECT f.canary IS NOT NULL, a.request_id, a.stage, a.outcome, a.http_status, a.tokens_input, a.tokens_output,
       a.reported_cost
FROM ai_attempts a JOIN fleet_members f USING (run_id, member)
WHERE a.run_id = %(run)s AND a.stage = ANY(%(stages)s) AND (f.canary IS NULL OR f.canary = %(canary)s)
  AND a.started_at >= to_timestamp(%(start)s) AND a.started_at < to_timestamp(%(end)s)
ORDER BY a.id
"""

_DEAD_LETTERS_SQL = """
SELECT stage, kafka_partition, reason IN %(errors)s, count(*) FROM dead_letters
WHERE run_id = %(run)s AND stage = ANY(%(stages)s)
  AND at >= to_timestamp(%(start)s) AND at < to_timestamp(%(end)s)
GROUP BY 1, 2, 3
"""


def partition_key(stage_index: int, partition: int) -> int:
    """A sample's key for a partition of the `stage_index`-th changed stage's source topic: the
    stages read different topics, whose partitions share numbers."""
    return stage_index * 100_000 + partition


@dataclass(frozen=True)
class AnalysisWindow:
    """One step's analysis window (epoch seconds) and the records that arrived on each partition
    of the changed stages' source topics meanwhile (log-end offsets at its end less at its start),
    keyed by `partition_key`."""

    start: float
    end: float
    arrived: Mapping[int, int]


ACTIVE, CANDIDATE = "active", "candidate"  # the two sides of a canary


def samples(database_url: str, run_id: str, canary_id: int, stages: Sequence[str], window: AnalysisWindow,
            configs: Mapping[str, PipelineConfig], partitions: Mapping[str, set[int]],
            member_in_flight: int) -> dict[str, VersionSample]:
    """Each side's sample over `window` (ACTIVE: the group's own fleets, CANDIDATE: canary
    `canary_id`'s): `configs` its configuration, `partitions` the source partitions it held
    through the window (`partition_key`s of `stages`, in that order)."""
    params = {"run": run_id, "canary": canary_id, "stages": list(stages), "start": window.start,
              "end": window.end, "errors": ERROR_REASONS}
    latencies: dict[str, list[Timed]] = defaultdict(list)
    overheads: dict[str, list[Timed]] = defaultdict(list)
    done: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    requests: dict[str, set[str]] = defaultdict(set)
    index = {stage: i for i, stage in enumerate(stages)}
    for canary, request_id, stage, partition, produced, e2e, per_stage in rows(database_url, _RESULTS_SQL,
                                                                                params):
        side = CANDIDATE if canary else ACTIVE
        requests[side].add(request_id)
        done[side][partition_key(index[stage], partition)] += 1
        if e2e is not None:
            latencies[side].append((float(produced), float(e2e)))
            ai_s = configs[side].spec.path_s({name: float(s) for name, s in (per_stage or {}).items()})
            overheads[side].append((float(produced), max(0.0, float(e2e) - ai_s)))
    dead: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # side -> [errors, dead letters]
    owner = {key: side for side, held in partitions.items() for key in held}
    for stage, partition, is_error, count in rows(database_url, _DEAD_LETTERS_SQL, params):
        key = partition_key(index[stage], partition)
        if key in owner:
            dead[owner[key]][0 if is_error else 1] += count
            done[owner[key]][key] += count
    costs, calls = _costs(rows(database_url, _ATTEMPTS_SQL, params), configs, requests)
    return {side: VersionSample(
        latencies_s=latencies[side], overheads_s=overheads[side], costs=costs[side],
        completed=len(requests[side]), errors=dead[side][0], dead_lettered=dead[side][1],
        partitions={key: (window.arrived.get(key, 0), done[side][key]) for key in sorted(partitions[side])},
        ai_calls=calls[side], member_in_flight=member_in_flight) for side in (ACTIVE, CANDIDATE)}


def _costs(found: Sequence[Sequence[Any]], configs: Mapping[str, PipelineConfig],
           completed: Mapping[str, set[str]]) -> tuple[dict[str, list[float] | None], dict[str, int]]:
    """Per side, each completed request's cost at its own configuration's prices (None when a
    try is unpriced), and the AI calls it made."""
    prices = {side: prices_of(config.spec) for side, config in configs.items()}
    per_request: dict[str, dict[str, float | None]] = defaultdict(dict)
    calls: dict[str, int] = defaultdict(int)
    for canary, request_id, stage, outcome, status, tokens_in, tokens_out, reported in found:
        side, key = CANDIDATE if canary else ACTIVE, str(request_id)
        calls[side] += 1
        attempt = cost.Attempt(key, stage, outcome, status, tokens_in, tokens_out, reported)
        if not cost.billed(attempt) or key not in completed[side]:
            continue
        price, _ = cost.call_cost(attempt, prices[side].get(stage))
        so_far = per_request[side].get(key, 0.0)
        per_request[side][key] = None if price is None or so_far is None else so_far + price
    result: dict[str, list[float] | None] = {}
    for side in (ACTIVE, CANDIDATE):
        values = list(per_request[side].values())
        result[side] = None if any(v is None for v in values) else [v for v in values if v is not None]
    return result, calls
