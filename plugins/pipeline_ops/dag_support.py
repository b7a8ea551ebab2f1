"""What every DAG of the platform shares: default arguments, form parameters, Spark wiring."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Param

from consumers import presets, profiles
from spark.jars import connector_jars

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ARGS: dict[str, Any] = {"owner": "platform", "retries": 1, "retry_delay": timedelta(seconds=30)}
TAGS_PIPELINE = ["pipeline", "kafka", "genai"]

BOOTSTRAP = "{{ conn.kafka_default.extra_dejson['bootstrap.servers'] }}"
DATABASE_URL = "{{ conn.postgres_default.get_uri() }}"


def spark_application(job: str) -> str:
    return str(REPO / "spark" / f"{job}.py")


def spark_env() -> dict[str, str]:
    """Executors use the same interpreter as the driver (the project's environment)."""
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def spark_analysis(run_id: str) -> tuple[SparkSubmitOperator, SparkSubmitOperator]:
    """The two Spark jobs over one run, on `spark_default`: partition load/skew of its style topic,
    then the run's pipeline figures. `run_id` may be a template."""
    common = {"conn_id": "spark_default", "jars": connector_jars(), "env_vars": spark_env()}
    partition_load = SparkSubmitOperator(
        task_id="partition_load", application=spark_application("partition_load"), name="partition_load",
        application_args=["--bootstrap-servers", BOOTSTRAP, "--topics", run_id + ".style",
                          "--run-id", run_id, "--database-url", DATABASE_URL], **common)
    analysis = SparkSubmitOperator(
        task_id="pipeline_analysis", application=spark_application("pipeline_analysis"),
        name="pipeline_analysis", application_args=["--run-id", run_id, "--database-url", DATABASE_URL],
        **common)
    partition_load >> analysis
    return partition_load, analysis


def profile_param(default: str = "durability") -> Param:
    return Param(default, type="string", enum=list(profiles.PROFILES),
                 description="Kafka optimisation profile: topic replication/min ISR and client settings")


def preset_params() -> dict[str, Param]:
    """Form fields shared by the DAGs that build a candidate from a preset."""
    return {
        "partitions": Param(16, type="integer", minimum=1, maximum=1024,
                            description="partitions of the stage topics"),
        "concurrency": Param(16, type="integer", minimum=1, maximum=1024,
                             description="AI concurrency per endpoint (the service's limit)"),
        "time_scale": Param(0.05, type="number", exclusiveMinimum=0, maximum=1,
                            description="multiplies AI latencies and Kafka group timeouts; 1 = real scale"),
        "burst": Param(320, type="integer", minimum=1, description="requests sent as fast as possible"),
        "flow_members": Param(2, type="integer", minimum=1, description="members per flow stage"),
    }


def candidate_param() -> Param:
    return Param("active", type="string", enum=["active", *presets.NAMES],
                 description="configuration to measure: the active version (the flow preset when "
                             "none is active yet) or a named preset")
