"""Named configurations of a pipeline, built from shared parameters: the benchmark compares them
side by side and the tuning DAG offers them as candidates. The consumer modes apply to the
stages that call an AI endpoint; the others read with one flow member.

baseline     no keys (sticky partitions), client defaults, 500-record batches processed before
             committing: the reference article's starting point
tuned        a UUID key per event and bounded polls of one record: the article's fix
flow         UUID keys and the flow-controlled consumer: a few members whose windows add up to
             FLOW_WINDOW_FACTOR times the AI concurrency, with the AI calls capped at the
             concurrency, so records that wait on writing their result or on an acknowledged
             send never idle an AI slot
flow-kip848  `flow` with the KIP-848 consumer group protocol (`group.protocol=consumer`)
flow-exactly-once  `flow` whose stages send their outputs and commit their offsets in one Kafka
             transaction per member and commit (`consumers.runtime.outbox`)
flow-adaptive  `flow` told nothing of the AI concurrency: each fleet discovers its endpoint's
             limit while calling it (`consumers.ai.limit`); the members' windows only
             cap it at ADAPTIVE_CEILING calls
share        UUID keys and share-group members (KIP-932, `consumers.runtime.share_member`; the client
             marks its ShareConsumer preview): twice flow's members, each handling a poll of
             `window` records at once, for the same AI concurrency in total
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from consumers.config import pipeline_spec
from consumers.config.candidate import PipelineConfig, StageConfig

NAMES = ("baseline", "tuned", "flow", "flow-kip848", "flow-exactly-once", "flow-adaptive", "share")
ADAPTIVE_CEILING = 256  # calls in flight per AI stage, far above the published limits
# Records in flight per AI call allowed. A record holds its place in the window for its call and
# then while its result is written and its sends are acknowledged (Little's law: records in
# flight = rate x that whole time), and with acks=all on three brokers the acknowledgements can
# outlast a call (docs/design.md#a-flow-window-holds-four-records-per-ai-call).
FLOW_WINDOW_FACTOR = 4


@dataclass(frozen=True)
class PresetParams:
    """What every preset shares: the pipeline, partitions, AI limits, time scale and load."""

    partitions: int = 64
    concurrency: int = 64  # per AI endpoint
    time_scale: float = 0.1
    burst: int = 1280
    flow_members: int = 4
    replication_factor: int = 1
    pipeline: str = pipeline_spec.REFERENCE
    # Stand-in settings per endpoint on top of the spec's (e.g. a per-minute budget that binds)
    endpoint_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def spec(self) -> pipeline_spec.PipelineSpec:
        return pipeline_spec.load(self.pipeline)

    @property
    def bottleneck(self) -> str:
        """The endpoint with the highest mean latency of those the stages call: with equal limits,
        the pipeline's bottleneck."""
        return max(self.spec.called_endpoints, key=lambda name: self.spec.endpoints[name].latency.mean_s)

    @property
    def slowest_call_s(self) -> float:
        """The bottleneck's mean latency (real scale)."""
        return self.spec.endpoints[self.bottleneck].latency.mean_s

    @property
    def ai_capacity_rps(self) -> float:
        """The physical limit: concurrency / the slowest endpoint's mean latency (scaled)."""
        return self.concurrency / (self.slowest_call_s * self.time_scale)

    def stand_in_settings(self, bottleneck_factor: float = 1.0) -> dict[str, Any]:
        """`PUT /v1/config` of the stand-in: every endpoint at its spec's latency (the slowest
        one's times `bottleneck_factor`, to make a slower candidate), this concurrency, no
        injected faults, no limit schedule, the spec's budgets (a run's earlier settings do not
        stay), this time scale, and `endpoint_settings` over it."""
        factors = {self.bottleneck: bottleneck_factor}
        return {"time_scale": self.time_scale,
                **{name: {"latency_s": e.latency.median_s * factors.get(name, 1.0), "limit": self.concurrency,
                          "error_rate": 0.0, "limit_schedule": [],
                          "requests_per_minute": e.requests_per_minute,
                          "tokens_per_minute": e.tokens_per_minute, "retry_after_on_budget": True,
                          **self.endpoint_settings.get(name, {})}
                   for name, e in self.spec.endpoints.items()}}


def build(name: str, p: PresetParams) -> PipelineConfig:
    """The PipelineConfig of a named preset."""
    spec = p.spec
    common = PipelineConfig(pipeline=p.pipeline, partitions=p.partitions,
                            replication_factor=p.replication_factor, time_scale=p.time_scale,
                            max_attempts=6,
                            stages={s: StageConfig("flow", members=1, window=32)
                                    for s in spec.stage_names if s not in spec.ai_stages})
    # One member per partition for the one-at-a-time modes: as many as can be busy at once.
    members = min(p.partitions, p.concurrency)
    window = max(1, p.concurrency // p.flow_members)

    def ai_stages(stage: StageConfig) -> dict[str, StageConfig]:
        return dict.fromkeys(spec.ai_stages, stage)

    flow = common.with_stages(**ai_stages(StageConfig("flow", members=p.flow_members,
                                                      window=FLOW_WINDOW_FACTOR * window,
                                                      ai_calls=p.concurrency)))
    configs = {
        "baseline": replace(common, key_strategy="none", profile="latency").with_stages(
            **ai_stages(StageConfig("baseline", members=members))),
        "tuned": common.with_stages(**ai_stages(StageConfig("bounded", members=members, batch_size=1))),
        "flow": flow,
        "flow-kip848": replace(flow, group_protocol="consumer"),
        "flow-exactly-once": replace(flow, exactly_once=True),
        "flow-adaptive": common.with_stages(**ai_stages(StageConfig(
            "flow", members=p.flow_members, window=ADAPTIVE_CEILING // p.flow_members, adaptive=True))),
        "share": common.with_stages(**ai_stages(StageConfig(
            "share", members=2 * p.flow_members, window=max(1, p.concurrency // (2 * p.flow_members))))),
    }
    if name not in configs:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(NAMES)}")
    return configs[name]
