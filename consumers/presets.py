"""Named pipeline configurations, built from shared parameters: the benchmark compares them
side by side and the tuning DAG offers them as candidates.

baseline     no keys (sticky partitions), client defaults, 500-record batches processed before
             committing: the reference article's starting point
tuned        a UUID key per event and bounded polls of one record: the article's fix
flow         UUID keys and the flow-controlled consumer: a few members whose windows add up to
             the AI concurrency
flow-kip848  `flow` with the KIP-848 consumer group protocol (`group.protocol=consumer`)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from consumers.pipeline_config import PipelineConfig, StageConfig

NAMES = ("baseline", "tuned", "flow", "flow-kip848")


@dataclass(frozen=True)
class PresetParams:
    """What every preset shares: partitions, AI limits, time scale and load."""

    partitions: int = 64
    concurrency: int = 64  # per AI endpoint
    time_scale: float = 0.1
    burst: int = 1280
    flow_members: int = 4
    replication_factor: int = 1
    check_latency_s: float = 0.5
    generate_latency_s: float = 3.0

    @property
    def ai_capacity_rps(self) -> float:
        """The physical limit: generative concurrency / generative latency (scaled)."""
        return self.concurrency / (self.generate_latency_s * self.time_scale)


def build(name: str, p: PresetParams) -> PipelineConfig:
    """The PipelineConfig of a named preset."""
    common = PipelineConfig(partitions=p.partitions, replication_factor=p.replication_factor,
                            time_scale=p.time_scale, max_attempts=6,
                            ai_timeout_s=max(1.0, 4 * p.generate_latency_s * p.time_scale),
                            intake=StageConfig("flow", members=1, window=32))
    # One member per partition for the one-at-a-time modes: as many as can be busy at once.
    members = min(p.partitions, p.concurrency)
    window = max(1, p.concurrency // p.flow_members)
    flow = replace(common, check=StageConfig("flow", members=p.flow_members, window=window),
                   generate=StageConfig("flow", members=p.flow_members, window=window))
    configs = {
        "baseline": replace(common, key_strategy="none", profile="latency",
                            check=StageConfig("baseline", members=members),
                            generate=StageConfig("baseline", members=members)),
        "tuned": replace(common, check=StageConfig("bounded", members=members, batch_size=1),
                         generate=StageConfig("bounded", members=members, batch_size=1)),
        "flow": flow,
        "flow-kip848": replace(flow, group_protocol="consumer"),
    }
    if name not in configs:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(NAMES)}")
    return configs[name]
