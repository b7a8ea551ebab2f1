"""A pipeline's topics, created or grown from a profile."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from airflow.sdk import BaseOperator

from consumers.config import events, pipeline_spec
from measure.sizing import SizingInput, size
from pipeline_ops.operators.runs import provision_topics


class ProvisionTopicsOperator(BaseOperator):
    """Create or grow a pipeline's topics from a profile; partitions given or sized from rates."""

    template_fields = ("pipeline", "prefix", "partitions", "profile", "replication_factor", "target_rps",
                       "produce_rps", "consume_rps")

    def __init__(self, *, prefix: str, pipeline: str = pipeline_spec.REFERENCE, profile: str = "durability",
                 partitions: int | str | None = None, replication_factor: int | str | None = None,
                 target_rps: float | str | None = None,
                 produce_rps_per_partition: float | str = 50_000.0,
                 consume_rps_per_partition: float | str | None = None,
                 kafka_config_id: str = "kafka_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prefix, self.pipeline, self.profile, self.partitions = prefix, pipeline, profile, partitions
        self.replication_factor, self.target_rps = replication_factor, target_rps
        self.produce_rps = produce_rps_per_partition
        self.consume_rps = consume_rps_per_partition
        self.kafka_config_id = kafka_config_id

    def execute(self, context: Any) -> dict[str, Any]:
        partitions = int(self.partitions) if self.partitions else None
        reasoning = None
        if partitions is None:
            if not self.target_rps or not self.consume_rps:
                raise ValueError("give the partitions, or a target rate and the measured per-partition "
                                 "consume rate to size them from")
            sizing = size(SizingInput(float(self.target_rps), float(self.produce_rps),
                                      float(self.consume_rps)))
            partitions, reasoning = sizing["partitions"], "; ".join(sizing["reasoning"])
            self.log.info(reasoning)
        rf = int(self.replication_factor) if self.replication_factor else None
        topics = events.Topics(self.prefix, pipeline_spec.load(self.pipeline))
        reports = provision_topics(self.kafka_config_id, topics, partitions, self.profile, rf)
        for r in reports:
            self.log.info("%s: %s, %d partitions, RF %d %s", r.topic, r.action, r.partitions,
                          r.replication_factor, "; ".join(r.warnings))
        return {"partitions": partitions, "sizing": reasoning, "topics": [asdict(r) for r in reports]}
