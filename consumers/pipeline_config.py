"""What defines a candidate configuration of the pipeline, and how it maps to each stage's fleet.

A `PipelineConfig` is plain data (it round-trips through JSON), so the same configuration is
stored in the registry, passed to deployed fleet processes and compared by the benchmark.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StageConfig:
    """How one stage consumes."""

    mode: str = "flow"
    members: int = 1
    window: int = 16
    batch_size: int = 1


@dataclass(frozen=True)
class PipelineConfig:
    """Everything that defines a candidate configuration of the pipeline."""

    partitions: int = 8
    replication_factor: int | None = None
    profile: str = "durability"
    key_strategy: str = "uuid"
    producer_profile: str | None = None  # default: same as `profile`
    group_protocol: str = "classic"
    time_scale: float = 1.0
    intake: StageConfig = StageConfig(mode="bounded", members=1, batch_size=50)
    check: StageConfig = StageConfig()
    generate: StageConfig = StageConfig()
    max_attempts: int = 4
    ai_timeout_s: float = 10.0
    backoff_base_s: float = 0.2
    stats_interval_ms: int = 0
    shutdown_deadline_s: float = 30.0

    def stage(self, name: str) -> StageConfig:
        return {"intake": self.intake, "check": self.check, "generate": self.generate}[name]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PipelineConfig:
        """Build from a (possibly partial) dict; unknown keys are an error, not ignored."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown configuration keys {unknown}; known: {sorted(known)}")
        stages = {name: StageConfig(**data[name]) for name in ("intake", "check", "generate")
                  if isinstance(data.get(name), dict)}
        return replace(cls(), **{**data, **stages})

    @classmethod
    def from_argument(cls, text: str) -> PipelineConfig:
        """A command's --config: JSON, or @file.json."""
        if text.startswith("@"):
            text = Path(text[1:]).read_text()
        return cls.from_dict(json.loads(text))


@dataclass
class Endpoints:
    """Where the AI services are, as a real deployment would configure them."""

    check_url: str
    generate_url: str
    auth_header: str | None = None
