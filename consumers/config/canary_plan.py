"""What a candidate may change to run as a canary, and how a canary's share grows.

A canary runs the candidate's fleets beside the active version's on the live topics, each
taking a share of a changed stage's partitions. The two versions share the topics, the keys that
place requests on them and the stages' groups, so a candidate that changes any of those cannot
canary: it needs topics of its own (the trials of `pipeline_tuning`). `canary_refusals` names
each such difference by its field; `changed_stages` the stages whose fleets the candidate
configures differently (only they get a canary fleet); `CanaryPlan` the steps a canary's share
takes. `producer_profile` is never refused: it picks the load source's client settings, none of
the topics' (a profile's topic settings are `profile`'s, `profiles.TopicSettings`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields, replace
from typing import Any

from consumers.config import profiles
from consumers.config.candidate import PipelineConfig

# What the topics and groups the two versions share are, apart from the pipeline, the topic
# settings and the stages' modes: refused when they differ, each for its reason.
SHARED = {
    "partitions": "the topics' partition count: more partitions move keys to other partitions, "
                  "the active version's too",
    "key_strategy": "how the stages key what they send on: which partition of a shared topic a "
                    "request lands on",
    "group_protocol": "the protocol of the stages' consumer groups, which the canary's fleets "
                      "share with the active version's",
    "time_scale": "it scales the groups' clocks (max.poll.interval.ms, the session timeout, a share "
                  "group's record lock) that the live groups run on",
}


@dataclass(frozen=True)
class Refusal:
    """Why a candidate cannot canary: the configuration field at fault (a stage's as
    `<stage>.<field>`) and the reason."""

    field: str
    reason: str


def canary_refusals(active: PipelineConfig, candidate: PipelineConfig) -> list[Refusal]:
    """What keeps `candidate` from running beside `active` on its topics; none: it can canary."""
    if candidate.pipeline != active.pipeline:
        return [Refusal("pipeline", f"{candidate.pipeline} is another pipeline than {active.pipeline}: "
                                    "its topics are others")]
    refused = [Refusal(name, f"{reason} ({getattr(active, name)!r} -> {getattr(candidate, name)!r})")
               for name, reason in SHARED.items() if getattr(active, name) != getattr(candidate, name)]
    refused += _topic_refusals(active, candidate)
    for stage in active.spec.stage_names:
        before, after = active.stage(stage).mode, candidate.stage(stage).mode
        if (before == "share") != (after == "share"):
            refused.append(Refusal(f"{stage}.mode", "a share group is not a consumer group: the stage's "
                                   f"records cannot be split between the two ({before} -> {after})"))
    return refused


def _topic_refusals(active: PipelineConfig, candidate: PipelineConfig) -> list[Refusal]:
    """The topic settings the two would provision differently: the replication factor (the
    profile's when unset), and the profile's other topic settings."""
    before, after = _topic_settings(active), _topic_settings(candidate)
    refused = []
    if before.replication_factor != after.replication_factor:
        refused.append(Refusal("replication_factor", f"the topics' replication factor "
                               f"({before.replication_factor} -> {after.replication_factor})"))
    changed = [f"{f.name} {getattr(before, f.name)!r} -> {getattr(after, f.name)!r}" for f in fields(before)
               if f.name != "replication_factor" and getattr(before, f.name) != getattr(after, f.name)]
    if changed:
        refused.append(Refusal("profile", f"{active.profile} -> {candidate.profile} changes the topics' "
                                          f"settings: {', '.join(changed)}"))
    return refused


def _topic_settings(config: PipelineConfig) -> profiles.TopicSettings:
    settings = profiles.get(config.profile).topic
    if config.replication_factor is None:
        return settings
    return replace(settings, replication_factor=config.replication_factor)


def changed_stages(active: PipelineConfig, candidate: PipelineConfig) -> list[str]:
    """The candidate's stages whose fleets it configures differently from `active`, in the
    spec's order: their consumer settings, their AI work (as the spec with each one's work
    changes has it: a change to what the spec already says changes nothing), or what the
    configuration gives every fleet (client profile, timeouts, retries, exactly-once...). Of
    another pipeline, every stage."""
    stages = candidate.spec.stage_names
    if candidate.pipeline != active.pipeline:
        return list(stages)
    return [stage for stage in stages if _fleet_view(active, stage) != _fleet_view(candidate, stage)]


def _fleet_view(config: PipelineConfig, stage: str) -> tuple[Any, ...]:
    """What a configuration gives a stage's fleet (`fleet_settings.settings_for` reads it), but
    for the run: its consumer settings, its work, and the settings every fleet reads."""
    return (replace(config.stage(stage), work={}), config.spec.stages[stage].work, config.profile,
            config.key_strategy, config.group_protocol, config.time_scale, config.stats_interval_ms,
            config.shutdown_deadline_s, config.exactly_once, config.ai_timeout(stage),
            config.ai_timeout_floor(stage), config.retry(stage), config.producer_batch_records(stage))


@dataclass(frozen=True)
class CanaryPlan:
    """How a canary's share of each changed stage's partitions grows: `steps` in turn (shares in
    (0, 1], strictly increasing, ending with the whole stage, e.g. (0.1, 0.5, 1.0)), each held
    for `window_s` seconds of analysis against the active version before the next, a person's
    approval waited for at most `approval_timeout_s` (as Argo Rollouts and Flagger step a
    canary's traffic weight with an analysis between steps). A marginal window is lengthened by
    up to `extensions` more of `window_s` before a person is asked: more of the same minutes
    settle a shift beyond the tolerance that is not yet significant (Argo Rollouts' analysis
    likewise measures again while it is inconclusive)."""

    steps: tuple[float, ...]
    window_s: float
    approval_timeout_s: float
    extensions: int = 2

    def __post_init__(self) -> None:
        steps = tuple(self.steps)  # JSON gives a list
        object.__setattr__(self, "steps", steps)
        if not steps:
            raise ValueError("steps: at least one share, the last 1.0")
        outside = [s for s in steps if not _number(s) or not 0 < s <= 1]
        if outside:
            raise ValueError(f"steps: each share is in (0, 1], got {outside}")
        if any(later <= earlier for earlier, later in itertools.pairwise(steps)):
            raise ValueError(f"steps must increase strictly, got {list(steps)}")
        if steps[-1] != 1.0:
            raise ValueError(f"steps must end at 1.0 (the whole stage), got {list(steps)}")
        for name in ("window_s", "approval_timeout_s"):
            value = getattr(self, name)
            if not _number(value) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(self.extensions, int) or isinstance(self.extensions, bool) or self.extensions < 0:
            raise ValueError(f"extensions must be a whole number of windows, 0 or more, "
                             f"got {self.extensions!r}")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
