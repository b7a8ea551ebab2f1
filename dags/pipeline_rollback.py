"""Re-activate an earlier configuration version, with a reason kept in the promotion history."""

from __future__ import annotations

from airflow.sdk import Param

from pipeline_ops import dag_support as s
from pipeline_ops.operators.promotion import RollbackOperator


@s.pipeline_dag(
    "pipeline_rollback", "gate", retries=0,
    params={
        "pipeline": s.pipeline_param(),
        "version": Param(0, type="integer", minimum=0,
                         description="configuration version of the pipeline to re-activate; 0: the "
                                     "version that was active before its current one"),
        "reason": Param(type="string", minLength=1, maxLength=500,
                        description="why: kept with the rollback in the promotion history"),
    },
    doc_md="""
### Rollback
Makes the chosen version (or the one active before the current version) the active configuration
of the chosen pipeline (a version of another pipeline is refused) and records the rollback with
its reason (`promotions`, the gate page's history). The gate page's *Roll back* button triggers
this DAG through the REST API. It changes what the next nightly run measures; it does not redeploy
running fleets.
""",
)
def pipeline_rollback() -> None:
    RollbackOperator(task_id="rollback", pipeline="{{ params.pipeline }}", version="{{ params.version }}",
                     reason="{{ params.reason }}")


pipeline_rollback()
