"""What every DAG of the platform shares: default arguments, form parameters, the pipeline check
that starts each DAG running a pipeline, Spark wiring."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Param, dag

from consumers.config import pipeline_spec, presets, profiles
from pipeline_ops.operators.analysis import AnalysisSubmitOperator
from pipeline_ops.operators.check import CheckPipelineOperator
from spark.jars import connector_jars

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ARGS: dict[str, Any] = {"owner": "platform", "retries": 1, "retry_delay": timedelta(seconds=30)}
TAGS_PIPELINE = ["pipeline", "kafka", "genai"]
CHECK_TASK = "check_pipeline"
NIGHTLY = "0 2 * * *"
START = datetime(2026, 1, 1)


def pipeline_dag(dag_id: str, tag: str, *, schedule: Any = None, retries: int | None = None,
                 **kwargs: Any) -> Callable[..., Any]:
    """The decorator of every pipeline DAG: one start date and no catch-up (a run is for now, not
    for the days it missed), the pipeline tags and default arguments; `retries=0` for a DAG whose
    tasks must not run twice on their own (a deploy, a promotion, a measurement)."""
    default_args = DEFAULT_ARGS if retries is None else {**DEFAULT_ARGS, "retries": retries}
    return dag(dag_id=dag_id, schedule=schedule, start_date=START, catchup=False,
               tags=[*TAGS_PIPELINE, tag], default_args=default_args, **kwargs)


def tuning_schedule() -> str | None:
    """When the active version is re-measured: `PIPELINE_TUNING_SCHEDULE`, a cron expression, or
    `none` for triggered runs only (an Airflow that serves a UI and must start nothing of its
    own); nightly at 02:00 UTC when unset."""
    value = os.environ.get("PIPELINE_TUNING_SCHEDULE") or NIGHTLY
    return None if value.strip().lower() == "none" else value


def spec_value(key: str) -> str:
    """A Jinja expression for what the check task returned of the run's pipeline spec
    (`completing_stage`, `measure`, ...): later tasks' templates read the spec from there."""
    return f"ti.xcom_pull(task_ids='{CHECK_TASK}')['{key}']"


def pipeline_param() -> Param:
    """The pipeline a run is for: a dropdown of the specs found (pipeline_spec.available())."""
    return Param(pipeline_spec.REFERENCE, type="string", enum=pipeline_spec.available(),
                 description="the pipeline (a spec in pipelines/): its topics, stages and AI endpoints")


def check_pipeline(version: str | None = None) -> CheckPipelineOperator:
    """The first task of a DAG that runs a pipeline: the chosen spec is refused, with the field at
    fault, before anything is provisioned (and so is a `version` of another pipeline)."""
    return CheckPipelineOperator(task_id=CHECK_TASK, pipeline="{{ params.pipeline }}", version=version)


def spark_application(job: str) -> str:
    return str(REPO / "spark" / f"{job}.py")


def spark_env() -> dict[str, str]:
    """Executors use the same interpreter as the driver (the project's environment)."""
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def spark_analysis(run_ids: str, key: str) -> AnalysisSubmitOperator:
    """The analysis of runs on `spark_default`, one Spark application (spark/analyses.py) for
    its two jobs: partition load, skew and its diagnosis of the runs' measured topics (the spec's
    `load.measure`; stored under `key`, a template), then each run's pipeline figures from its
    completing stage. `run_ids` is a Jinja expression giving the list of runs (e.g.
    `[params.run_id]`): one JVM start for both jobs and all the trials of a tuning run instead of
    one per job. The spec's values come from the check task; the Kafka connection and the
    database URL reach the jobs in their environment. With the stack's Spark Connect server
    (`spark_connect_default`), the jobs run on it and no JVM starts."""
    topics = ("{% for r in " + run_ids + " %}{{ r }}.{{ " + spec_value("measure") + " }}"
              "{{ '' if loop.last else ',' }}{% endfor %}")
    return AnalysisSubmitOperator(
        task_id="spark_analysis", application=spark_application("analyses"), name="analyses",
        conn_id="spark_default", spark_connect_conn_id="spark_connect_default", jars=connector_jars(),
        env_vars=spark_env(), application_args=[
            "partition_load", "--topics", topics, "--run-id", key, "--",
            "pipeline_analysis", "--run-id", "{{ " + run_ids + " | join(',') }}",
            "--final-stage", "{{ " + spec_value("completing_stage") + " }}"])


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
        "time_scale": Param(0.3, type="number", exclusiveMinimum=0, maximum=1,
                            description="multiplies AI latencies and Kafka group timeouts; 1 = real scale "
                                        "(0.3: a 3 s AI call takes 0.9 s, against which the "
                                        "platform's per-call work is small)"),
        "burst": Param(320, type="integer", minimum=1, description="requests sent as fast as possible"),
        "flow_members": Param(2, type="integer", minimum=1, description="members per flow stage"),
    }


def preset_values() -> dict[str, str]:
    """The preset form fields as templates, for ResolveCandidateOperator."""
    return {name: f"{{{{ params.{name} }}}}" for name in preset_params()}


def gate_params() -> dict[str, Param]:
    """The gate's form fields: trials and thresholds."""
    return {
        "trials": Param(3, type="integer", minimum=2, maximum=20,
                        description="times the candidate is measured; the gate decides on 95% confidence "
                                    "bounds over them"),
        "target_utilization": Param(0.9, type="number", minimum=0, maximum=1,
                                    description="gate: lower bound of the share of the AI capacity used "
                                                "(capacity = concurrency / measured mean call time)"),
        "min_throughput_rps": Param(0.0, type="number", minimum=0,
                                    description="gate: optional absolute floor on the lower bound of the "
                                                "steady throughput (requests/s); 0: none"),
        "tolerance": Param(0.1, type="number", minimum=0, exclusiveMaximum=1,
                           description="gate: allowed drop of the steady throughput against the active "
                                       "version's last measurement (lower bound of the difference)"),
        "max_skew": Param(2.0, type="number", minimum=1,
                          description="gate: largest allowed max/mean of requests per partition"),
        "max_cost_per_request": Param(0.0, type="number", minimum=0,
                                      description="gate: optional ceiling on the upper bound of the AI "
                                                  "cost per completed request (reported by the gateway "
                                                  "or from the endpoints' declared prices); 0: none"),
        "require_objective": Param(False, type="boolean",
                                   description="gate: hold the trials to the pipeline's latency objective "
                                               "(the spec's `objective`): the lower bound of the share "
                                               "of requests within it at least the share declared"),
    }


def candidate_param() -> Param:
    return Param("active", type="string", enum=["active", *presets.NAMES],
                 description="configuration to measure: the pipeline's active version (the flow preset "
                             "when none is active yet) or a named preset")
