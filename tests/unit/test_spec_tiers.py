"""The tiers an endpoint sells and the deadlines a stage declares, checked with the field at
fault: on the shipped support_tickets spec with a batch and a flex tier added to its large
model, and one change at a time that the check must refuse."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from consumers.config import pipeline_spec

BATCH = {"protocol": "openai_batch", "price": {"input_per_1k": 0.00125, "output_per_1k": 0.005},
         "window_s": 3600, "max_requests": 50000, "max_bytes": 200_000_000}
FLEX = {"fields": {"service_tier": "flex"}, "price": {"input_per_1k": 0.00125, "output_per_1k": 0.005},
        "window_s": 120}


def tiered() -> dict[str, Any]:
    """support_tickets whose draft may wait an hour and a half for the batch or flex tier."""
    document = yaml.safe_load(pipeline_spec.path_of("support_tickets").read_text())
    tiers = {"batch": copy.deepcopy(BATCH), "flex": copy.deepcopy(FLEX)}
    document["endpoints"]["large_model"]["tiers"] = tiers
    document["stages"]["draft"]["tiers"] = ["realtime", "flex", "batch"]
    document["stages"]["draft"]["deadline"] = {"within_s": 5400}
    return document


def refused(document: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(pipeline_spec.SpecError) as error:
        pipeline_spec.parse(document)
    return error.value.problems


def test_a_stage_that_may_wait_for_cheaper_tiers_is_accepted() -> None:
    spec = pipeline_spec.parse(tiered())
    draft = spec.stages["draft"]
    assert draft.tiers == ["realtime", "flex", "batch"] and draft.deadline.within_s == 5400
    batch = spec.endpoints["large_model"].tiers.batch
    assert batch.protocol == "openai_batch" and batch.price.input_per_1k == 0.00125
    # the shipped spec drafts a ticket that says how long its customer may wait at flex or batch prices
    shipped = pipeline_spec.load("support_tickets")
    assert shipped.stages["draft"].tiers == ["realtime", "flex", "batch"]
    assert shipped.endpoints["large_model"].tiers.flex.fields == {"service_tier": "flex"}
    assert shipped.stages["draft"].deadline.event_field == "answer_within_s"
    assert shipped.stages["draft"].deadline.within_s is None  # a ticket without it: realtime
    assert shipped.stages["triage"].tiers == ["realtime"]


def test_a_tier_the_endpoint_does_not_sell_is_refused_at_the_stage_s_list() -> None:
    document = tiered()
    del document["endpoints"]["large_model"]["tiers"]["flex"]
    problems = refused(document)
    assert ("stages.draft.tiers.1", "endpoint 'large_model' sells no flex tier, only ['realtime', 'batch']") \
        in problems, problems


def test_a_deadline_shorter_than_a_tier_s_window_is_refused() -> None:
    document = tiered()
    document["stages"]["draft"]["deadline"] = {"within_s": 1800}
    problems = refused(document)
    assert problems == [("stages.draft.deadline.within_s", "1800 s is shorter than the batch tier's window "
                         "(3600 s): the tier could never meet it")], problems


@pytest.mark.parametrize(("change", "field", "message"), [
    (lambda d: d["endpoints"]["large_model"]["tiers"]["batch"].pop("price"),
     "endpoints.large_model.tiers.batch.price", "a tier is chosen by its price"),
    (lambda d: d["endpoints"]["large_model"].pop("price"),
     "endpoints.large_model.price", "weighed against the realtime price"),
    (lambda d: d["endpoints"]["large_model"]["tiers"]["flex"].update(
        price={"input_per_1k": 0.0025, "output_per_1k": 0.01}),  # realtime's own
     "endpoints.large_model.tiers.flex.price", "not cheaper than the realtime price"),
    (lambda d: d["endpoints"]["large_model"]["tiers"]["batch"].update(protocol="anthropic_batch"),
     "stages.draft.tiers.2", "anthropic_batch batches carry anthropic_messages requests"),
    (lambda d: d["stages"]["draft"].pop("deadline"), "stages.draft.deadline", "say by when it is due"),
    (lambda d: d["stages"]["draft"].update(deadline={"field": "due_in_s"}),
     "stages.draft.deadline.field", "the events have no field 'due_in_s'"),
    (lambda d: d["stages"]["draft"].update(deadline={"field": "subject"}),
     "stages.draft.deadline.field", "'subject' holds seconds"),
    (lambda d: d["stages"]["draft"].update(deadline={}), "stages.draft.deadline",
     "a deadline names within_s, a field of the events, or both"),
    (lambda d: d["stages"]["draft"].update(tiers=["batch", "overnight"]), "stages.draft.tiers.1",
     "Input should be"),
])
def test_the_check_names_the_field_at_fault(change: Any, field: str, message: str) -> None:
    document = tiered()
    change(document)
    problems = refused(document)
    assert any(path == field and message in text for path, text in problems), problems


def test_a_per_record_deadline_field_is_a_number_the_events_carry() -> None:
    document = tiered()
    draft = document["stages"]["draft"]
    draft["schema"]["properties"]["due_in_s"] = {"type": "number"}
    draft["deadline"] = {"field": "due_in_s"}  # no fixed deadline: nothing to set against a window
    assert pipeline_spec.parse(document).stages["draft"].deadline.event_field == "due_in_s"
