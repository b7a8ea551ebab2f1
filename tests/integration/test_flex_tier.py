"""The flex tier on the real broker, PostgreSQL and the stand-in's flex processing: support
tickets whose customers may wait longer than a realtime call but not for a batch get their
drafts from flex calls at half the price; a flex call refused for want of capacity is followed
by a realtime one at once, before the ticket's deadline. Counted from the rows, the stand-in's
counters and a read_committed reader of the replies."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from consumers.runs.pipeline_run import Pipeline
from tests.integration.pipeline_fixtures import AIService, ai_service, query
from tests.integration.test_batch_tier import (
    BILLED,
    QUICK,
    TICKETS,
    TIME_SCALE,
    WAITING,
    assert_half_price,
    draft_tries,
    replies_once,
)
from tests.integration.test_batch_tier import run as run_tickets
from tests.stack import Stack

# 20 s here: past a flex call's declared 0.3 s and the realtime call kept in hand (about 6 s),
# short of the batch's declared 18 s with it
WITHIN_S = 4000
DUE_S = WITHIN_S * TIME_SCALE


@pytest.fixture(scope="module")
def ai() -> Iterator[AIService]:
    with ai_service(time_scale=TIME_SCALE) as service:
        yield service


def run(stack: Stack, ai: AIService, refuse_rate: float) -> tuple[Pipeline, dict[str, int], dict]:
    """The tickets through the pipeline, the stand-in refusing `refuse_rate` of the flex calls."""
    return run_tickets(stack, ai, QUICK, WITHIN_S, large_model={"flex_refuse_rate": refuse_rate})


def late_drafts(stack: Stack, run_id: str) -> list[tuple]:
    """The waiting tickets' drafts recorded after their deadline."""
    return query(stack.database_url, "SELECT r.request_id FROM requests r JOIN stage_results s "
                 "ON s.request_id = r.request_id AND s.stage = 'draft' WHERE r.run_id = %s "
                 "AND s.completed_at > r.produced_at + %s * interval '1 second'", run_id, DUE_S)


def test_tickets_that_may_wait_a_little_are_drafted_by_flex_calls_at_half_the_price(
        stack: Stack, ai: AIService) -> None:
    pipeline, counts, stats = run(stack, ai, refuse_rate=0.0)
    assert counts == {"completed": TICKETS}, counts
    assert draft_tries(stack, pipeline.run_id) == {("flex", "ok"): WAITING,
                                                   ("realtime", "ok"): TICKETS - WAITING}
    assert query(stack.database_url, "SELECT count(*) FROM batch_lines WHERE run_id = %s",
                 pipeline.run_id) == [(0,)]
    large = stats["large_model"]
    assert (large["served"], large["flex_served"], large["duplicate_served"]) == (TICKETS, WAITING, 0)
    assert late_drafts(stack, pipeline.run_id) == []
    replies_once(stack, pipeline)
    assert_half_price(stack, pipeline, "flex")


def test_a_refused_flex_call_is_made_realtime_before_the_deadline(stack: Stack, ai: AIService) -> None:
    pipeline, counts, stats = run(stack, ai, refuse_rate=0.5)
    assert counts == {"completed": TICKETS}, counts
    tries = draft_tries(stack, pipeline.run_id, [*BILLED, "http_429"])
    large = stats["large_model"]
    refused = tries[("flex", "http_429")]
    # every refusal the stand-in counted is on record, and each was followed by a realtime call
    assert refused == large["flex_refused"] > 0
    assert tries == {("flex", "ok"): WAITING - refused, ("flex", "http_429"): refused,
                     ("realtime", "ok"): TICKETS - WAITING + refused}
    assert (large["served"], large["duplicate_served"]) == (TICKETS, 0)
    assert late_drafts(stack, pipeline.run_id) == []
    replies_once(stack, pipeline)
