"""The main job: measure a candidate configuration on the real pipeline and promote it only if
the gate passes. Manually triggered with a form, and nightly as a regression run of the active
configuration."""

from __future__ import annotations

from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import Param, dag

from pipeline_ops import dag_support as s
from pipeline_ops.operators import (
    DeployFleetOperator,
    GateReportOperator,
    LoadTestOperator,
    PromoteOperator,
    PromotionGateOperator,
    ProvisionTopicsOperator,
    ResolveCandidateOperator,
)

RUN = "{{ ti.xcom_pull(task_ids='resolve')['run_id'] }}"


@dag(
    dag_id="pipeline_tuning",
    schedule="0 2 * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=[*s.TAGS_PIPELINE, "gate"],
    default_args=s.DEFAULT_ARGS,
    params={
        "candidate": s.candidate_param(),
        "overrides": Param({}, type="object", description="configuration keys to override, e.g. "
                                                          '{"key_strategy": "none"}'),
        **s.preset_params(),
        "min_throughput_rps": Param(20.0, type="number", minimum=0,
                                    description="gate: absolute throughput floor (requests/s)"),
        "tolerance": Param(0.1, type="number", minimum=0, exclusiveMaximum=1,
                           description="gate: allowed drop against the active version's throughput"),
        "max_skew": Param(2.0, type="number", minimum=1,
                          description="gate: largest allowed max/mean of requests per partition"),
    },
    doc_md="""
### Pipeline tuning
provision -> deploy the candidate -> load test -> Spark analysis -> gate -> promote or reject ->
report. The gate's checks, with what was measured and what was required, are in the `gate`
task's log, the registry (`gate_decisions`) and `results/<run id>/gate.txt` with the plots.
""",
)
def pipeline_tuning() -> None:
    resolve = ResolveCandidateOperator(
        task_id="resolve", candidate="{{ params.candidate }}", overrides="{{ params.overrides | tojson }}",
        preset_params={k: f"{{{{ params.{k} }}}}" for k in ("partitions", "concurrency", "time_scale",
                                                             "burst", "flow_members")})
    candidate = resolve.output
    provision = ProvisionTopicsOperator(
        task_id="provision", prefix=RUN,
        partitions="{{ ti.xcom_pull(task_ids='resolve')['config']['partitions'] }}",
        profile="{{ ti.xcom_pull(task_ids='resolve')['config']['profile'] }}",
        replication_factor="{{ ti.xcom_pull(task_ids='resolve')['config']['replication_factor'] or '' }}")
    deploy = DeployFleetOperator(task_id="deploy", action="start", run_id=RUN,
                                 version="{{ ti.xcom_pull(task_ids='resolve')['version'] }}",
                                 ai_limit="{{ params.concurrency }}")
    load = LoadTestOperator(task_id="load_test", run_id=RUN, burst="{{ params.burst }}",
                            version="{{ ti.xcom_pull(task_ids='resolve')['version'] }}")
    stop = DeployFleetOperator(task_id="stop_fleets", action="stop", run_id=RUN, trigger_rule="all_done")
    partition_load, analysis = s.spark_analysis(RUN)
    gate = PromotionGateOperator(task_id="gate", candidate=candidate, load=load.output,
                                 min_throughput_rps="{{ params.min_throughput_rps }}",
                                 tolerance="{{ params.tolerance }}", max_skew="{{ params.max_skew }}")
    promote = PromoteOperator(task_id="promote", candidate=candidate)
    reject = EmptyOperator(task_id="reject", doc_md="The gate rejected the candidate; see its report.")
    report = GateReportOperator(task_id="report", candidate=candidate,
                                trigger_rule="none_failed_min_one_success")

    resolve >> provision >> deploy >> load >> stop
    [load, stop] >> partition_load
    analysis >> gate >> [promote, reject] >> report


pipeline_tuning()
