"""Find the highest steady request rate a configuration sustains, and keep it in the registry."""

from __future__ import annotations

from airflow.sdk import Param

from pipeline_ops import dag_support as s
from pipeline_ops.operators.candidate import ResolveCandidateOperator
from pipeline_ops.operators.capacity import CapacitySearchOperator


@s.pipeline_dag(
    "pipeline_capacity", "capacity", retries=0, max_active_runs=1,
    params={
        "pipeline": s.pipeline_param(),
        "candidate": s.candidate_param(),
        "overrides": Param({}, type="object", description="configuration keys to override"),
        **s.preset_params(),
        "step_s": Param(20.0, type="number", minimum=5,
                        description="seconds of steady load per step (wall clock)"),
        "p99_objective_s": Param(10.0, type="number", exclusiveMinimum=0,
                                 description="end-to-end p99 objective in real-scale seconds (the time "
                                             "scale applies)"),
        "lag_growth": Param(0.05, type="number", minimum=0, exclusiveMaximum=1,
                            description="largest lag trend over a step's second half, as a share of the "
                                        "rate: above it the consumers fall behind (the lag's in-flight "
                                        "and commit noise makes much less than 5% unmeasurable in "
                                        "short steps)"),
        "precision": Param(0.03, type="number", exclusiveMinimum=0, exclusiveMaximum=1,
                           description="stop bisecting when the bracket is this share of its upper end"),
        "max_steps": Param(8, type="integer", minimum=2, maximum=20, description="most steps to run"),
    },
    doc_md="""
### Capacity search
The highest steady rate of the chosen pipeline at which the configuration keeps consumer lag
bounded and the end-to-end p99 under the objective (`consumers/runs/capacity_search.py`): a calibration burst
(`burst` requests) measures the AI capacity, then steady-rate steps, each with its lag sampled,
step up or down from 90% of it and bisect. The result is stored beside the configuration
(`capacity_searches`, gate page); `results/<run id>/capacity.png` plots the lag and the p99 of
every step.
""",
)
def pipeline_capacity() -> None:
    resolve = ResolveCandidateOperator(
        task_id="resolve", pipeline="{{ params.pipeline }}", candidate="{{ params.candidate }}",
        overrides="{{ params.overrides | tojson }}", run_prefix="capacity", preset_params=s.preset_values())
    search = CapacitySearchOperator(
        task_id="search", run_id="{{ ti.xcom_pull(task_ids='resolve')['run_id'] }}",
        version="{{ ti.xcom_pull(task_ids='resolve')['version'] }}", ai_limit="{{ params.concurrency }}",
        burst="{{ params.burst }}", step_s="{{ params.step_s }}",
        p99_objective_s="{{ params.p99_objective_s }}", lag_growth="{{ params.lag_growth }}",
        precision="{{ params.precision }}", max_steps="{{ params.max_steps }}")
    s.check_pipeline() >> resolve >> search


pipeline_capacity()
