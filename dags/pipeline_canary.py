"""Promotion on live traffic: a candidate takes a growing share of the live partitions beside the
active version, judged on the same minutes of the same traffic after each step."""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta

from airflow.providers.standard.operators.hitl import HITLBranchOperator
from airflow.sdk import Param

from measure.canary import CanaryThresholds
from pipeline_ops import dag_support as s
from pipeline_ops.operators.canary import (
    CanaryCloseOperator,
    CanaryDecideOperator,
    CanaryOpenOperator,
    CanaryStepOperator,
)

MAX_STEPS = 4  # analysis steps a plan may have, before its last (share 1: the promotion)
APPROVAL_TIMEOUT = timedelta(minutes=30)  # a marginal step not reviewed by then is rolled back
OPENED = "{{ ti.xcom_pull(task_ids='open') | tojson }}"


@s.pipeline_dag(
    "pipeline_canary", "canary", retries=0, max_active_runs=1,
    params={
        "pipeline": s.pipeline_param(),
        "run_id": Param("pipeline", type="string", pattern="^[a-zA-Z0-9._-]{1,100}$",
                        description="the live deployment (pipeline_deploy's run id) whose topics the "
                                    "canary shares"),
        "candidate": Param("active", type="string",
                           description="`active` (the active version), a registered version's number, "
                                       "or a preset of the pipeline"),
        "overrides": Param({}, type="object",
                           description="configuration keys to change, e.g. {\"draft\": {\"work\": "
                                       "{\"endpoint\": \"large_model_next\"}}}: a stage's keys change "
                                       "only what they name"),
        "steps": Param([0.1, 0.5, 1.0], type="array", items={"type": "number"},
                       description=f"the candidate's share of each changed stage's partitions, step by "
                                   f"step, ending at 1 (at most {MAX_STEPS} steps before it)"),
        "window_s": Param(60, type="number", exclusiveMinimum=0,
                          description="seconds of analysis per step, once the candidate holds its share"),
        "extensions": Param(2, type="integer", minimum=0,
                            description="windows a marginal step may add before a person is asked: "
                                        "more of the same minutes settle a shift not yet significant"),
        "thresholds": Param(asdict(CanaryThresholds()), type="object",
                            description="the judge's bounds (measure.canary.CanaryThresholds)"),
    },
    doc_md=f"""
### Canary
The candidate's fleets run beside the live deployment's on its topics; each step lends them the
first share of each changed stage's partitions (the active group keeps the rest), waits until
they hold them, and judges one window of both versions' rows: end-to-end latency and the platform's
overhead per second, cost per request (Mann-Whitney U with the Hodges-Lehmann shift), error and
dead-letter rates, and whether each of the candidate's partitions keeps up. Pass goes on, fail
rolls back at once, marginal lengthens the window (up to `extensions` times) and then waits for
a person's review (rolled back after {APPROVAL_TIMEOUT}). After the last step the candidate
takes every partition while the live fleets restart at its configuration, and it is the active
version. A candidate that changes partitions, replication, keys or the group protocol is
refused with the field at fault: it goes through `pipeline_tuning`. The gate page shows each
canary's steps (docs/canary.md).
""",
)
def pipeline_canary() -> None:
    joins = "none_failed_min_one_success"  # reached from one branch, the others skipped
    opened = CanaryOpenOperator(
        task_id="open", pipeline="{{ params.pipeline }}", run_id="{{ params.run_id }}",
        candidate="{{ params.candidate }}", overrides="{{ params.overrides | tojson }}",
        steps="{{ params.steps | tojson }}", window_s="{{ params.window_s }}",
        extensions="{{ params.extensions }}", thresholds="{{ params.thresholds | tojson }}",
        approval_timeout_s=APPROVAL_TIMEOUT.total_seconds())
    promote = CanaryCloseOperator(task_id="promote", canary=OPENED, action="promote", trigger_rule=joins)
    rollback = CanaryCloseOperator(task_id="rollback", canary=OPENED, action="rollback", trigger_rule=joins)
    settle = CanaryCloseOperator(task_id="settle", canary=OPENED, action="settle", trigger_rule="all_done")
    runs = [CanaryStepOperator(task_id=f"step_{i}", canary=OPENED, step=i, trigger_rule=joins)
            for i in range(1, MAX_STEPS + 1)]
    s.check_pipeline() >> opened >> runs[0]
    for i, run in enumerate(runs, start=1):
        following = runs[i].task_id if i < MAX_STEPS else promote.task_id
        decide = CanaryDecideOperator(task_id=f"decide_{i}", step=i, last=MAX_STEPS)
        review = HITLBranchOperator(
            task_id=f"review_{i}", subject=f"Canary step {i} is marginal",
            body=f"{{{{ ti.xcom_pull(task_ids='step_{i}') | tojson }}}}",
            options=["Go on", "Roll back"], defaults=["Roll back"], response_timeout=APPROVAL_TIMEOUT,
            options_mapping={"Go on": following, "Roll back": rollback.task_id})
        run >> decide >> [review, rollback, promote]
        review >> [rollback, promote]
        if i < MAX_STEPS:
            decide >> runs[i]
            review >> runs[i]
    [promote, rollback] >> settle


pipeline_canary()
