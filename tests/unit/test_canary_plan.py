"""What can canary beside the active version on its topics (`consumers.config.canary_plan`): a
candidate that changes what the topics or the groups are is refused, naming the field; the
stages whose fleets it configures differently are the ones that get a canary fleet; a plan's
steps grow to the whole stage. Hand-written cases on support_tickets."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from consumers.config.canary_plan import CanaryPlan, Refusal, canary_refusals, changed_stages
from consumers.config.candidate import PipelineConfig, StageConfig

ACTIVE = PipelineConfig(pipeline="support_tickets", partitions=16, time_scale=0.5,
                        stages={"triage": StageConfig("flow", members=2, window=16),
                                "draft": StageConfig("flow", members=2, window=32)})
SHARED_TRIAGE = replace(ACTIVE, stages={**ACTIVE.stages, "triage": StageConfig("share", members=4, window=8)})


def with_draft(**changes: Any) -> PipelineConfig:
    return ACTIVE.with_stages(draft=replace(ACTIVE.stage("draft"), **changes))


def test_an_identical_candidate_can_canary_and_changes_no_stage() -> None:
    same = PipelineConfig.from_dict(ACTIVE.to_dict())
    assert canary_refusals(ACTIVE, same) == []
    assert changed_stages(ACTIVE, same) == []


def test_a_work_change_changes_exactly_its_stage() -> None:
    candidate = with_draft(work={"endpoint": "large_model_next"})
    assert canary_refusals(ACTIVE, candidate) == []
    assert changed_stages(ACTIVE, candidate) == ["draft"]
    assert changed_stages(ACTIVE, with_draft(work={"temperature": 0.7})) == ["draft"]


def test_a_change_to_what_the_spec_already_says_changes_nothing() -> None:
    assert changed_stages(ACTIVE, with_draft(work={"endpoint": "large_model", "temperature": 0.3})) == []


def test_consumer_settings_change_their_stage_and_fleet_wide_settings_every_stage() -> None:
    assert changed_stages(ACTIVE, with_draft(window=64)) == ["draft"]
    assert changed_stages(ACTIVE, ACTIVE.with_stages(triage=StageConfig("bounded", members=8))) == ["triage"]
    for fleet_wide in ({"max_attempts": 6}, {"ai_timeout_s": 20.0}, {"exactly_once": True},
                       {"profile": "throughput"}):
        assert changed_stages(ACTIVE, replace(ACTIVE, **fleet_wide)) == ["triage", "draft"], fleet_wide


# (the candidate, the one field refused)
REFUSED = {
    "another pipeline": (replace(ACTIVE, pipeline="text_moderation", stages={}), "pipeline"),
    "more partitions": (replace(ACTIVE, partitions=32), "partitions"),
    "another replication factor": (replace(ACTIVE, replication_factor=1), "replication_factor"),
    "other keys": (replace(ACTIVE, key_strategy="field:ticket_id"), "key_strategy"),
    "topic settings of another profile": (replace(ACTIVE, profile="availability"), "profile"),
    "KIP-848 groups": (replace(ACTIVE, group_protocol="consumer"), "group_protocol"),
    "another time scale": (replace(ACTIVE, time_scale=1.0), "time_scale"),
    "a stage into share mode": (SHARED_TRIAGE, "triage.mode"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_candidate_changing_the_topics_or_the_groups_is_refused_naming_the_field(case: str) -> None:
    candidate, field = REFUSED[case]
    refusals = canary_refusals(ACTIVE, candidate)
    assert [r.field for r in refusals] == [field]
    assert all(r.reason for r in refusals)


def test_each_refusal_says_what_changes() -> None:
    assert canary_refusals(ACTIVE, replace(ACTIVE, profile="availability")) == [Refusal(
        "profile", "durability -> availability changes the topics' settings: "
                   "min_insync_replicas 2 -> 1, unclean_leader_election False -> True")]
    assert canary_refusals(SHARED_TRIAGE, ACTIVE) == [Refusal(
        "triage.mode", "a share group is not a consumer group: the stage's records cannot be split "
                       "between the two (share -> flow)")]
    (partitions,) = canary_refusals(ACTIVE, replace(ACTIVE, partitions=32))
    assert partitions.reason.endswith("(16 -> 32)")
    assert changed_stages(ACTIVE, replace(ACTIVE, pipeline="text_moderation", stages={})) == [
        "moderate", "summarize", "classify", "join"]


def test_what_leaves_the_topics_as_they_are_is_not_refused() -> None:
    for candidate in (replace(ACTIVE, profile="throughput"),  # the same topic settings
                      replace(ACTIVE, replication_factor=3),  # the profile's own
                      replace(ACTIVE, producer_profile="latency"),  # the load source's clients only
                      with_draft(mode="bounded", window=1)):  # a group mode for a group mode
        assert canary_refusals(ACTIVE, candidate) == [], candidate
    assert changed_stages(ACTIVE, replace(ACTIVE, producer_profile="latency")) == []


def test_a_plan_steps_up_to_the_whole_stage() -> None:
    plan = CanaryPlan(steps=[0.1, 0.5, 1.0], window_s=300, approval_timeout_s=3600.0)  # type: ignore[arg-type]
    assert plan.steps == (0.1, 0.5, 1.0)
    assert CanaryPlan((1.0,), 60.0, 60.0).steps == (1.0,)
    assert (plan.extensions, CanaryPlan((1.0,), 60.0, 60.0, extensions=0).extensions) == (2, 0)


@pytest.mark.parametrize(("changes", "message"), [
    ({"steps": ()}, "at least one share"),
    ({"steps": (0.0, 1.0)}, r"each share is in \(0, 1\], got \[0.0\]"),
    ({"steps": (0.5, 1.5)}, r"got \[1.5\]"),
    ({"steps": (float("nan"), 1.0)}, "each share is in"),
    ({"steps": (True, 1.0)}, "each share is in"),
    ({"steps": (0.5, 0.5, 1.0)}, "increase strictly"),
    ({"steps": (0.5, 0.2, 1.0)}, "increase strictly"),
    ({"steps": (0.1, 0.5)}, "end at 1.0"),
    ({"window_s": 0}, "window_s must be a positive number of seconds"),
    ({"window_s": float("inf")}, "window_s must be"),
    ({"approval_timeout_s": -1.0}, "approval_timeout_s must be"),
    ({"approval_timeout_s": "1h"}, "approval_timeout_s must be"),
    ({"extensions": -1}, "extensions must be a whole number of windows"),
    ({"extensions": 1.5}, "extensions must be"),
    ({"extensions": True}, "extensions must be"),
])
def test_a_plan_that_does_not_step_up_to_the_whole_stage_is_refused(changes: dict[str, Any],
                                                                    message: str) -> None:
    plan = {"steps": (0.1, 0.5, 1.0), "window_s": 300.0, "approval_timeout_s": 3600.0, **changes}
    with pytest.raises(ValueError, match=message):
        CanaryPlan(**plan)
