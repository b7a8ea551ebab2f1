"""The main job: measure a candidate configuration on the real pipeline, repeatedly, and promote
it only if the gate passes. Manually triggered with a form, and nightly as a regression run of
the active configuration."""

from __future__ import annotations

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import Param

from pipeline_ops import dag_support as s
from pipeline_ops.operators.candidate import ResolveCandidateOperator
from pipeline_ops.operators.promotion import GateReportOperator, PromoteOperator, PromotionGateOperator
from pipeline_ops.operators.trials import TrialsOperator

RUN = "{{ ti.xcom_pull(task_ids='resolve')['run_id'] }}"


@s.pipeline_dag(
    "pipeline_tuning", "gate", schedule=s.tuning_schedule(), max_active_runs=1,
    params={
        "pipeline": s.pipeline_param(),
        "candidate": s.candidate_param(),
        "overrides": Param({}, type="object", description="configuration keys to override, e.g. "
                                                          '{"key_strategy": "none"}'),
        **s.preset_params(),
        **s.gate_params(),
    },
    doc_md="""
### Pipeline tuning
check the chosen pipeline (its spec and its AI endpoints' connections: a refused spec fails
`check_pipeline` with the field at fault, before anything is provisioned) -> resolve the candidate
(a preset of that pipeline, or its active version) -> `trials` measurements, one after the other
(fresh topics, the candidate's fleets, a burst, fleets stopped) -> Spark analysis of every trial
(one Spark application: partition load with each trial's skew diagnosis, then the pipeline
figures) -> gate -> promote or reject -> report. The gate decides on 95% confidence bounds over the
trials:
utilization of the AI capacity against the target, and the difference of steady throughput against
the last measurement of the active version of the same pipeline (each pipeline has its own).
Nightly, the active version is re-measured against its own history: a failure raises a regression
alarm (gate page) and promoting it again is a no-op. Checks, intervals and plots are in the `gate`
task's log, the registry (`gate_decisions`), the gate page and `results/<run id>/gate.txt`.
""",
)
def pipeline_tuning() -> None:
    resolve = ResolveCandidateOperator(
        task_id="resolve", pipeline="{{ params.pipeline }}", candidate="{{ params.candidate }}",
        overrides="{{ params.overrides | tojson }}", preset_params=s.preset_values())
    candidate = resolve.output
    trials = TrialsOperator(task_id="trials", run_id=RUN, trials="{{ params.trials }}",
                            version="{{ ti.xcom_pull(task_ids='resolve')['version'] }}",
                            ai_limit="{{ params.concurrency }}", burst="{{ params.burst }}")
    analysis = s.spark_analysis("ti.xcom_pull(task_ids='trials')['run_ids']", RUN)
    gate = PromotionGateOperator(task_id="gate", candidate=candidate, trials=trials.output,
                                 target_utilization="{{ params.target_utilization }}",
                                 min_throughput_rps="{{ params.min_throughput_rps }}",
                                 tolerance="{{ params.tolerance }}", max_skew="{{ params.max_skew }}",
                                 max_cost_per_request="{{ params.max_cost_per_request }}",
                                 require_objective="{{ params.require_objective }}")
    promote = PromoteOperator(task_id="promote", candidate=candidate)
    reject = EmptyOperator(task_id="reject", doc_md="The gate rejected the candidate; see its report.")
    report = GateReportOperator(task_id="report", candidate=candidate,
                                trigger_rule="none_failed_min_one_success")

    check = s.check_pipeline()
    check >> resolve >> trials >> analysis >> gate >> [promote, reject] >> report


pipeline_tuning()
