"""The SQL of the run records' writes that take more than one statement's worth of thought: a
request row's status moving forward, a stage taking a request and claiming its AI call, a try's
attempt row started and ended, each in one round trip."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from consumers.runtime.storage.records import Ended, Key, Origin, ts

DEAD_LETTERED_RANK = 1_000_000  # above every stage's: only a settled status outranks it

# The request row's status moves to %(status)s unless it is settled or ranked higher.
FORWARD = ("status = CASE WHEN requests.status = ANY(%(settled)s) OR requests.status_rank > %(rank)s "
           "THEN requests.status ELSE %(status)s END, "
           "status_rank = CASE WHEN requests.status = ANY(%(settled)s) THEN requests.status_rank "
           "ELSE greatest(requests.status_rank, %(rank)s) END")

# Completes the attempt rows of %(ended_*)s (see `ended_params`), however many, in one statement.
END_ATTEMPTS = (
    "UPDATE ai_attempts a SET started_at = e.sent, ended_at = e.at, outcome = e.outcome, "
    "http_status = e.status, own_failure = e.own, tokens_input = e.tokens_input, "
    "tokens_output = e.tokens_output, reported_cost = e.cost, tier = e.tier "
    "FROM unnest(%(ended_id)s::bigint[], "
    "%(ended_sent)s::timestamptz[], %(ended_at)s::timestamptz[], %(ended_outcome)s::text[], "
    "%(ended_status)s::int[], %(ended_own)s::boolean[], %(ended_tokens_input)s::int[], "
    "%(ended_tokens_output)s::int[], %(ended_cost)s::float8[], %(ended_tier)s::text[]) "
    "AS e(id, sent, at, outcome, status, own, tokens_input, tokens_output, cost, tier) WHERE a.id = e.id")


def ended_params(ended: Sequence[Ended]) -> dict[str, list]:
    """The parameters of `END_ATTEMPTS`: one array per column."""
    return {"ended_id": [e.row for e in ended], "ended_sent": [ts(e.sent) for e in ended],
            "ended_at": [ts(e.at) for e in ended], "ended_outcome": [e.outcome for e in ended],
            "ended_status": [e.http_status for e in ended], "ended_own": [e.own for e in ended],
            "ended_tokens_input": [e.tokens_input for e in ended],
            "ended_tokens_output": [e.tokens_output for e in ended],
            "ended_cost": [e.reported_cost for e in ended], "ended_tier": [e.tier for e in ended]}


def row_params(key: Key, stage: str, origin: Origin) -> dict[str, Any]:
    """The named parameters every row of a stage's record carries: request, stage and offset."""
    return {"p": key.pipeline, "r": key.request_id, "s": stage, "run": key.run_id,
            "member": origin.member, "topic": origin.topic, "partition": origin.partition,
            "offset": origin.offset, "round": origin.redrive}


# Creates the request row or merges %(fields)s into it, moving its status forward.
TAKE = ("INSERT INTO requests (pipeline, request_id, run_id, status, status_rank, produced_at, fields) "
        "VALUES (%(p)s, %(r)s, %(run)s, coalesce(%(status)s, 'received'), greatest(%(rank)s, 0), "
        "%(at)s, %(fields)s) ON CONFLICT (pipeline, request_id) DO UPDATE "
        "SET fields = requests.fields || EXCLUDED.fields, "
        "produced_at = least(requests.produced_at, EXCLUDED.produced_at), "
        f"{FORWARD} RETURNING fields")

# The outcome of the first try's row while it waits for its permit: not a call (the figures count
# 'started' rows as billed calls, measure.cost.billed), so a crash meanwhile is none.
QUEUED = "queued"
# A try's attempt row (`row_params`'s parameters, %(attempt)s, %(sent)s), one per row of {source}.
START_ATTEMPT = (
    "INSERT INTO ai_attempts (pipeline, run_id, request_id, stage, attempt, member, topic, "
    "kafka_partition, kafka_offset, started_at, ended_at, outcome, redrive) "
    "SELECT %(p)s, %(run)s, %(r)s, %(s)s, {attempt}, %(member)s, %(topic)s, %(partition)s, "
    "%(offset)s, %(sent)s, {ended}, '{outcome}', %(round)s FROM {source} RETURNING id")

# TAKE, then the claim of (key, stage) unless its result is recorded (`done`: the skip is on
# record then) or the fields of %(join)s are not all on the row yet. The claim is %(o)s's when
# nobody holds it, when %(o)s holds it already, or when the holder's lease has expired (a member
# that died mid-call): then it is taken over. A claim won writes the first try's attempt row,
# QUEUED until the try is sent (`start_attempt`).
TAKE_AND_CLAIM = (
    f"WITH taken AS ({TAKE}), "
    "done AS (SELECT coalesce(result, '{}'::jsonb) AS result FROM stage_results "
    "WHERE pipeline = %(p)s AND request_id = %(r)s AND stage = %(s)s), "
    "skipped AS ("
    + START_ATTEMPT.format(attempt=0, ended="%(sent)s", outcome="skipped_done", source="done") + "), "
    "claimed AS (INSERT INTO stage_claims (pipeline, request_id, stage, owner, lease_until) "
    "SELECT %(p)s, %(r)s, %(s)s, %(o)s, now() + make_interval(secs => %(l)s) "
    "WHERE NOT EXISTS (SELECT FROM done) AND (SELECT fields FROM taken) ?& %(join)s::text[] "
    "ON CONFLICT (pipeline, request_id, stage) DO UPDATE SET owner = EXCLUDED.owner, "
    "lease_until = EXCLUDED.lease_until, "
    "takeovers = stage_claims.takeovers + (stage_claims.owner <> EXCLUDED.owner)::int "
    "WHERE stage_claims.owner = EXCLUDED.owner OR stage_claims.lease_until < now() "
    "RETURNING 1), "
    "first AS (" + START_ATTEMPT.format(attempt=1, ended="NULL", outcome=QUEUED, source="claimed") + "), "
    "own AS (SELECT count(*) AS n FROM ai_attempts WHERE pipeline = %(p)s AND request_id = %(r)s "
    "AND stage = %(s)s AND redrive = %(round)s AND own_failure) "
    "SELECT (SELECT fields FROM taken), (SELECT result FROM done), (SELECT id FROM first), "
    "(SELECT n FROM own)")

# A record's line for the batch tier (`row_params`'s parameters and %(event)s, %(body)s,
# %(deadline)s, %(fallback)s), unless %(park)s is false, the stage's result is recorded or the
# request has a line at the stage already; then the line found, as it is now (no row: none).
PARK = (
    "WITH parked AS (INSERT INTO batch_lines (pipeline, request_id, stage, run_id, event, body, member, "
    "topic, kafka_partition, kafka_offset, redrive, deadline_at, fallback_at) "
    "SELECT %(p)s, %(r)s, %(s)s, %(run)s, %(event)s, %(body)s, %(member)s, %(topic)s, %(partition)s, "
    "%(offset)s, %(round)s, %(deadline)s, %(fallback)s WHERE %(park)s AND NOT EXISTS ("
    "SELECT FROM stage_results WHERE pipeline = %(p)s AND request_id = %(r)s AND stage = %(s)s) "
    "ON CONFLICT (pipeline, request_id, stage) DO NOTHING RETURNING state, answer) "
    "SELECT state, answer FROM parked UNION ALL "
    "SELECT state, answer FROM batch_lines WHERE pipeline = %(p)s AND request_id = %(r)s AND stage = %(s)s")
