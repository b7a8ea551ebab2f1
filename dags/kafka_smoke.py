"""Smoke test of the platform's wiring: one message produced and consumed through Kafka."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag

from pipeline_ops.smoke import KafkaRoundTripOperator


@dag(
    dag_id="kafka_smoke",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["platform", "smoke"],
    default_args={"owner": "platform", "retries": 1, "retry_delay": timedelta(seconds=10)},
    doc_md="""
### Kafka smoke test
Creates a one-off topic on the `kafka_default` connection, produces a nonce, reads it back
and deletes the topic. Run it after pointing the platform at a new cluster.
""",
)
def kafka_smoke() -> None:
    KafkaRoundTripOperator(task_id="round_trip")


kafka_smoke()
