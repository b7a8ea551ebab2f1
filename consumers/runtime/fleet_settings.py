"""What one stage's fleet is given: its members' settings, its AI endpoint and how long a
claim lasts, built from a pipeline configuration (`settings_for`), and the check that refuses
a fleet its stage's endpoint was not given to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from consumers.ai.client import RetryPolicy
from consumers.config import events, pipeline_spec
from consumers.config.candidate import ENDPOINTS_ENV, Endpoints, PipelineConfig
from consumers.config.kafka_connection import KafkaAccess
from consumers.config.pipeline_spec import HttpWork
from consumers.runtime.member import MemberSettings

CLAIM_MARGIN_S = 2.0  # clock and database round trips between a lease's renewal and its try


class MissingEndpoint(ValueError):
    """The fleet's stage calls an AI endpoint the fleet was given no URL for."""


def check_endpoint(spec: pipeline_spec.PipelineSpec, settings: FleetSettings) -> None:
    """Refuse a fleet whose stage calls an AI endpoint it has no URL for. Started anyway, it would
    join its group and fail on the first record that needs the call; under a supervisor it would
    then start again, join again and fail again, each time moving the group's partitions."""
    work = spec.stages[settings.member.stage].work
    if isinstance(work, HttpWork) and not settings.ai_url:
        raise MissingEndpoint(
            f"stage {settings.member.stage!r} calls AI endpoint {work.endpoint!r} of pipeline "
            f"{spec.name}, and the fleet was given no URL for it: pass --ai-endpoints "
            f"'{{\"{work.endpoint}\": \"<url>\"}}' or set {ENDPOINTS_ENV}")


def member_name(stage: str, index: int, instance: str | None = None) -> str:
    """`<stage>-<n>`, or `<stage>-<instance>-<n>` when several processes run a stage's members;
    the stage comes first, which is how the platform's queries group members by stage."""
    return f"{stage}-{instance}-{index}" if instance else f"{stage}-{index}"


@dataclass(frozen=True)
class FleetSettings:
    """A stage's fleet: how many members, how each consumes, which AI endpoints it calls."""

    member: MemberSettings
    members: int
    prefix: str
    database_url: str
    pipeline: str = pipeline_spec.REFERENCE
    # The configuration's changes to its stages' AI work (PipelineConfig.work_changes): the fleet
    # runs the spec they make. Plain data, as the settings go to a fleet's own process.
    work_changes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    key_strategy: str = "uuid"  # keys of the events this stage sends downstream
    ai_url: str | None = None  # the stage's AI endpoint, when its work calls one
    ai_endpoint: str = ""  # its name in the pipeline spec
    ai_timeout_s: float = 10.0  # the most one try may take
    ai_timeout_floor_s: float | None = None  # the least its learned timeout goes to (None: fixed)
    ai_auth_header: str | None = None
    ai_calls: int | None = None  # AI calls in flight across the fleet, apart from records held
    adaptive: bool = False  # the AI calls in flight follow a limit discovered from the endpoint
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    shutdown_deadline_s: float = 30.0
    instance: str | None = None  # tells this process's members from another's (a pod's name)
    version: int | None = None  # the registry's configuration version it runs
    canary: int | None = None  # the canary whose borrowed partitions it works on (None: the group's)

    @property
    def claim_lease_s(self) -> float:
        """How long a (request, stage) claim outlives its last renewal. Renewed before each
        try, it must cover one try (bounded as a whole by the AI timeout, not per socket read:
        `ai_client._read_within`) and the backoff before the next; it is also how long a
        member that died mid-call holds up the copy of its record that a new member consumes."""
        return self.ai_timeout_s + self.retry.backoff_max_s + CLAIM_MARGIN_S

    @property
    def assignment_timeout_s(self) -> float:
        """How long the members may take to get their partitions: a classic group settles one
        join round at a time, so large fleets get longer."""
        return 60.0 + 2.0 * self.members


def settings_for(config: PipelineConfig, stage: str, run_id: str, topics: events.Topics,
                 kafka: KafkaAccess, database_url: str, endpoints: Endpoints) -> FleetSettings:
    """The fleet of one stage of a pipeline configuration, running as the stage's principal."""
    stage_cfg = config.stage(stage)
    member = MemberSettings(
        run_id=run_id, stage=stage, mode=stage_cfg.mode, group_id=topics.group_of(stage),
        kafka=kafka.of(stage), profile=config.profile, time_scale=config.time_scale,
        group_protocol=config.group_protocol, batch_size=stage_cfg.batch_size,
        window=stage_cfg.window, buffer=4 * stage_cfg.window,
        revoke_deadline_s=config.shutdown_deadline_s, stats_interval_ms=config.stats_interval_ms,
        exactly_once=config.exactly_once,
        producer_batch_records=config.producer_batch_records(stage))
    work = topics.spec.stages[stage].work
    return FleetSettings(
        member=member, members=stage_cfg.members, prefix=topics.prefix, database_url=database_url,
        pipeline=config.pipeline, work_changes=config.work_changes, key_strategy=config.key_strategy,
        ai_url=endpoints.urls.get(work.endpoint) if isinstance(work, HttpWork) else None,
        ai_endpoint=work.endpoint if isinstance(work, HttpWork) else "",
        ai_timeout_s=config.ai_timeout(stage), ai_timeout_floor_s=config.ai_timeout_floor(stage),
        ai_auth_header=endpoints.auth_for(work.endpoint) if isinstance(work, HttpWork) else None,
        ai_calls=stage_cfg.ai_calls, adaptive=stage_cfg.adaptive, retry=config.retry(stage),
        shutdown_deadline_s=config.shutdown_deadline_s)
