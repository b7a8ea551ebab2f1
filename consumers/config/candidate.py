"""What defines a candidate configuration of a pipeline, and how it maps to each stage's fleet.

A `PipelineConfig` is plain data (it round-trips through JSON), so the same configuration is
stored in the registry, passed to deployed fleet processes and compared by the benchmark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from consumers.ai import learned_timeout
from consumers.ai.client import RetryPolicy
from consumers.config import pipeline_spec

MIN_AI_TIMEOUT_S = 5.0
MIN_AI_TIMEOUT_FLOOR_S = 3.0  # over a busy machine's stalls, which no time scale shrinks
WINDOW_MODES = ("flow", "share")
ENDPOINTS_ENV = "AI_ENDPOINTS"  # how a fleet process is told where the AI endpoints are
KEYS_ENV = "AI_ENDPOINT_KEYS"  # and each endpoint's key (from its own connection), when it has one


@dataclass(frozen=True)
class StageConfig:
    """How one stage consumes. `ai_calls` caps the AI calls the fleet has in flight at once, apart
    from the records its members hold (which also wait on recording results and acknowledged
    sends); `adaptive` makes that cap follow a limit discovered from the endpoint
    (`consumers.ai.limit`). Without either, the members' windows are the only bound. `work`
    changes the stage's AI work ({field: value}: another endpoint of the spec, the model, the
    prompt; `pipeline_spec.with_work_changes`), so a candidate can switch a model or a prompt."""

    mode: str = "flow"
    members: int = 1
    window: int = 16
    batch_size: int = 1
    ai_calls: int | None = None
    adaptive: bool = False
    work: Mapping[str, Any] = field(default_factory=dict)

    @property
    def concurrent(self) -> int:
        """Records one member works on at once: its window in the modes that have one (flow,
        share), one in the modes that handle a batch one record after another."""
        return self.window if self.mode in WINDOW_MODES else 1

    @property
    def ai_calls_at_once(self) -> int:
        """AI calls the whole fleet can have under way: its members' records, capped by `ai_calls`."""
        held = self.members * self.concurrent
        return held if self.ai_calls is None else min(held, self.ai_calls)

    def to_dict(self) -> dict[str, Any]:
        """Its JSON form; without `work` when it changes nothing, so a configuration stored before
        work changes existed keeps its JSON (the registry finds a stored one by it)."""
        data = asdict(self)
        if not data["work"]:
            del data["work"]
        return data


@dataclass(frozen=True)
class PipelineConfig:
    """Everything that defines a candidate configuration of a pipeline.

    `stages` holds the stages configured explicitly; any other stage of the pipeline consumes
    with `default_stage` (its JSON form puts each stage beside the global settings, e.g.
    `{"partitions": 16, "check": {"mode": "flow", "window": 16}}`). The AI settings left None
    take the stage's values from the pipeline spec. A stage's `work` changes its AI work
    (`{"draft": {"work": {"endpoint": "large_model_next"}}}`): `spec` is the spec with every such
    change applied, and a change the spec cannot take is refused when the configuration is made.
    """

    pipeline: str = pipeline_spec.REFERENCE
    partitions: int = 8
    replication_factor: int | None = None
    profile: str = "durability"
    key_strategy: str = "uuid"
    producer_profile: str | None = None  # default: same as `profile`
    group_protocol: str = "classic"
    time_scale: float = 1.0
    stages: Mapping[str, StageConfig] = field(default_factory=dict)
    max_attempts: int | None = None
    ai_timeout_s: float | None = None
    backoff_base_s: float | None = None
    stats_interval_ms: int = 0
    shutdown_deadline_s: float = 30.0
    # Each stage's outputs and the input offsets they answer commit in one Kafka transaction, so
    # a read_committed reader sees every output once, even after a member died mid-burst.
    # Not the durability profile's default: a request's platform overhead grows tenfold, each
    # hop's outputs waiting for their transaction's commit (docs/benchmarks.md).
    exactly_once: bool = False

    def __post_init__(self) -> None:
        if self.work_changes:  # refused here, not when a fleet of the configuration starts
            pipeline_spec.load(self.pipeline, self.work_changes)

    @property
    def work_changes(self) -> dict[str, Mapping[str, Any]]:
        """Each configured stage's changes to its AI work, by stage (those that change any)."""
        return {name: stage.work for name, stage in self.stages.items() if stage.work}

    @property
    def spec(self) -> pipeline_spec.PipelineSpec:
        """The pipeline's spec as this configuration runs it: its work changes applied."""
        return pipeline_spec.load(self.pipeline, self.work_changes)

    def ai_timeout(self, stage: str) -> float:
        """Seconds one AI try may take at most: the configured value, or the spec's at this time
        scale (never under MIN_AI_TIMEOUT_S: a timed-out call may still be served, and paid for).
        Below it the timeout is learned from the endpoint's calls (consumers.ai.learned_timeout)."""
        if self.ai_timeout_s is not None:
            return self.ai_timeout_s
        return max(MIN_AI_TIMEOUT_S, self.spec.stages[stage].timeout_s * self.time_scale)

    def ai_timeout_floor(self, stage: str) -> float:
        """The least a stage's learned timeout goes down to: its margin over the latency the spec
        declares, at this time scale, under `ai_timeout`; the configured value when there is one
        (a fixed timeout)."""
        if self.ai_timeout_s is not None:
            return self.ai_timeout_s
        declared = learned_timeout.MARGIN * self.spec.declared_tail_s(stage) * self.time_scale
        return min(self.ai_timeout(stage), max(MIN_AI_TIMEOUT_FLOOR_S, declared))

    def retry(self, stage: str) -> RetryPolicy:
        """The stage's retry policy: the spec's, with the configured overrides; the backoff
        shrinks with the time scale like the latencies it waits out."""
        declared = self.spec.stages[stage].retry
        base = declared.backoff_base_s if self.backoff_base_s is None else self.backoff_base_s
        return RetryPolicy(max_attempts=self.max_attempts or declared.max_attempts,
                           backoff_base_s=base * max(self.time_scale, 0.05))

    def stage(self, name: str) -> StageConfig:
        """How stage `name` consumes: configured, or the default (a stage without AI work reads
        in bounded batches; an AI stage in flow mode)."""
        if name in self.stages:
            return self.stages[name]
        if name not in self.spec.stages:
            raise ValueError(f"{self.pipeline} has no stage {name!r}; stages: {list(self.spec.stages)}")
        return StageConfig() if name in self.spec.ai_stages else StageConfig(mode="bounded", batch_size=50)

    def producer_batch_records(self, writer: str | None) -> int | None:
        """The records one producer batch may hold for what `writer` (a stage, or None for the
        load source) writes: the smallest window of the share-mode stages it feeds, else no cap
        (profiles.producer_config says why)."""
        spec = self.spec
        written = set(spec.producing_topics() if writer is None else spec.outputs_of(writer))
        fed = [self.stage(name) for name, stage in spec.stages.items() if stage.source in written]
        return min((stage.window for stage in fed if stage.mode == "share"), default=None)

    def with_stages(self, **stages: StageConfig) -> PipelineConfig:
        return replace(self, stages={**self.stages, **stages})

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "stages"}
        return {**data, **{name: stage.to_dict() for name, stage in self.stages.items()}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def with_overrides(self, overrides: Mapping[str, Any]) -> PipelineConfig:
        """This configuration with `overrides` (the form's JSON) applied: a stage's keys change
        only what they name of its settings, as it consumes now; anything else is replaced."""
        data = self.to_dict()
        for key, value in overrides.items():
            if isinstance(value, Mapping) and key in self.spec.stages:
                data[key] = {**asdict(self.stage(key)), **value}
            else:
                data[key] = value
        return PipelineConfig.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PipelineConfig:
        """Build from a (possibly partial) dict; unknown keys are an error, not ignored."""
        known = {f.name for f in fields(cls)} - {"stages"}
        pipeline = data.get("pipeline", pipeline_spec.REFERENCE)
        stage_names = set(pipeline_spec.load(pipeline).stages)
        unknown = sorted(set(data) - known - stage_names)
        if unknown:
            raise ValueError(f"unknown configuration keys {unknown}; known: {sorted(known)} and the "
                             f"stages of {pipeline}: {sorted(stage_names)}")
        stages = {name: StageConfig(**data[name]) for name in stage_names if isinstance(data.get(name), dict)}
        return cls(**{k: v for k, v in data.items() if k in known}, stages=stages)

    @classmethod
    def from_argument(cls, text: str) -> PipelineConfig:
        """A command's --config: JSON, or @file.json."""
        if text.startswith("@"):
            text = Path(text[1:]).read_text()
        return cls.from_dict(json.loads(text))


@dataclass
class Endpoints:
    """Where each AI endpoint is (by the spec's endpoint name), as a deployment configures them,
    and the key each is called with: its own (`keys`, from its Airflow connection), else the
    one every endpoint shares (`auth_header`, the stand-in's token)."""

    urls: dict[str, str]
    auth_header: str | None = None
    keys: dict[str, str] = field(default_factory=dict)

    @classmethod
    def on(cls, base_url: str, spec: pipeline_spec.PipelineSpec, auth_header: str | None = None) -> Endpoints:
        """Every endpoint of `spec` served under one base URL (the stand-in serves them all)."""
        return cls({name: base_url.rstrip("/") + e.path for name, e in spec.endpoints.items()}, auth_header)

    def auth_for(self, name: str) -> str | None:
        key = self.keys.get(name)
        return f"Bearer {key}" if key else self.auth_header

    def environment(self) -> dict[str, str]:
        """The variables that hand the URLs and keys to a fleet process (`consumers.runtime.fleet` reads
        them): the environment, never a command line anyone on the host can list."""
        return {ENDPOINTS_ENV: json.dumps(dict(self.urls), sort_keys=True),
                **({KEYS_ENV: json.dumps(dict(self.keys), sort_keys=True)} if self.keys else {})}
