"""The canary DAG from its form to its decision, against the real stack: a live deployment of
support_tickets under supervisord takes a steady load while `pipeline_canary` runs; a slower,
dearer draft model is rolled back by itself at its first step, an identical candidate is
promoted through every step, and every ticket is handled; a candidate with more partitions is
refused, naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.integration.canary_fixtures import (
    SLOWER,
    Live,
    active_of,
    all_handled,
    canary_of,
    live_deployment,
    steady_load,
    why_of,
)
from tests.integration.pipeline_fixtures import query
from tests.stack import Stack

# The fleets call the stack's AI stand-in, which DAG runs reconfigure: alone on it for the module.
pytestmark = [pytest.mark.usefixtures("stand_in_for_module"), pytest.mark.timeout(1500)]

FORM = {"pipeline": "support_tickets", "candidate": "active", "steps": [0.25, 1.0], "window_s": 12}


@pytest.fixture(scope="module")
def live(stack: Stack) -> Iterator[Live]:
    with live_deployment(stack) as deployment:
        yield deployment


def test_a_slower_dearer_model_is_rolled_back_at_its_first_step(stack: Stack, live: Live) -> None:
    form = {**FORM, "run_id": live.run_id, "overrides": SLOWER}
    with steady_load(stack, live) as sent:
        run = stack.run_dag("pipeline_canary", conf=json.dumps(form))
    assert run.state == "success", run.output[-6000:]
    canary, state, steps = canary_of(stack, live)
    assert (state, steps) == ("rolled_back", [(1, "fail")]), why_of(stack, canary)
    assert active_of(stack) == [(live.version,)]
    all_handled(stack, live, sent)


def test_an_identical_candidate_is_promoted_through_every_step(stack: Stack, live: Live) -> None:
    with steady_load(stack, live) as sent:
        run = stack.run_dag("pipeline_canary", conf=json.dumps({**FORM, "run_id": live.run_id}))
    assert run.state == "success", run.output[-6000:]
    canary, state, steps = canary_of(stack, live)
    assert (state, steps) == ("promoted", [(1, "pass")]), why_of(stack, canary)
    # nothing to restart (the candidate configures every stage as the live fleets run it); the
    # canary's fleets stopped, one per AI stage (an identical candidate canaries them all)
    def states(deployment: str) -> list[tuple[str, str]]:
        return query(stack.database_url, "SELECT stage, state FROM deployments WHERE run_id = %s "
                     "ORDER BY stage, id", deployment)

    assert states(live.run_id) == [("draft", "running"), ("triage", "running")]
    assert states(f"{live.run_id}.canary-{canary}") == [("draft", "stopped"), ("triage", "stopped")]
    all_handled(stack, live, sent)


def test_a_candidate_with_more_partitions_is_refused_naming_the_field(stack: Stack, live: Live) -> None:
    def canaries() -> list[tuple]:
        return query(stack.database_url, "SELECT count(*) FROM canaries WHERE run_id = %s", live.run_id)

    before = canaries(), active_of(stack)
    run = stack.run_dag("pipeline_canary", conf=json.dumps({**FORM, "run_id": live.run_id,
                                                             "overrides": {"partitions": 8}}))
    assert run.state == "failed"
    assert "cannot canary on the live topics (use pipeline_tuning): partitions:" in run.output
    assert (canaries(), active_of(stack)) == before  # refused before anything was recorded or started
