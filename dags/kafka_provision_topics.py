"""Provision a pipeline's topics from a profile and a target throughput."""

from __future__ import annotations

from airflow.sdk import Asset, Param

from pipeline_ops import dag_support as s
from pipeline_ops.operators.topics import ProvisionTopicsOperator

TOPICS = Asset("kafka://pipeline/topics")


@s.pipeline_dag(
    "kafka_provision_topics", "provisioning",
    params={
        "pipeline": s.pipeline_param(),
        "prefix": Param("pipeline", type="string", pattern="^[a-zA-Z0-9._-]{1,100}$",
                        description="topic prefix: <prefix>.<topic> for each topic of the pipeline's "
                                    "spec, and <prefix>.dlq"),
        "profile": s.profile_param(),
        "target_rps": Param(21.3, type="number", exclusiveMinimum=0,
                            description="throughput the topics must carry (requests/s)"),
        "produce_rps_per_partition": Param(50000.0, type="number", exclusiveMinimum=0,
                                           description="measured producer throughput per partition"),
        "consume_rps_per_partition": Param(0.333, type="number", exclusiveMinimum=0,
                                           description="measured consumer throughput per partition; for "
                                                       "AI consumers concurrency per partition / latency"),
        "replication_factor": Param(1, type="integer", minimum=1, maximum=16,
                                    description="copies of each partition (at most the broker count)"),
    },
    doc_md="""
### Provision topics
Checks the chosen pipeline's spec and its AI endpoints' connections first (a refused spec fails
`check_pipeline` with the field at fault, and nothing is created). Sizes the partitions as
max(ceil(t / t_produce), ceil(t / t_consume)), then creates the spec's topics under the prefix and
its dead-letter topic, or grows them (never shrinks; growing moves keys, which the log warns
about), with the profile's replication, min ISR, retention and compression. Updates the
`kafka://pipeline/topics` asset.
""",
)
def kafka_provision_topics() -> None:
    s.check_pipeline() >> ProvisionTopicsOperator(
        task_id="provision", pipeline="{{ params.pipeline }}", prefix="{{ params.prefix }}",
        profile="{{ params.profile }}", target_rps="{{ params.target_rps }}",
        produce_rps_per_partition="{{ params.produce_rps_per_partition }}",
        consume_rps_per_partition="{{ params.consume_rps_per_partition }}",
        replication_factor="{{ params.replication_factor }}", outlets=[TOPICS])


kafka_provision_topics()
