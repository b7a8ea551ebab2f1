"""Start, scale, check or stop the consumer fleets of a pipeline at a configuration version."""

from __future__ import annotations

from airflow.sdk import Param

from pipeline_ops import dag_support as s
from pipeline_ops.operators.deploy import DeployFleetOperator


@s.pipeline_dag(
    "pipeline_deploy", "deploy", retries=0,
    params={
        "pipeline": s.pipeline_param(),
        "action": Param("start", type="string", enum=["start", "scale", "check", "stop"],
                        description="start the fleets, restart the AI stages at a new size, record "
                                    "their health, or stop them"),
        "run_id": Param("pipeline", type="string", pattern="^[a-zA-Z0-9._-]{1,100}$",
                        description="the deployment: records are written under it and its topics are "
                                    "<run_id>.*"),
        "version": Param(1, type="integer", minimum=1,
                         description="configuration version (registry) of the pipeline, for start "
                                     "and scale"),
        "members": Param(0, type="integer", minimum=0,
                         description="members per AI stage for `scale` (0: the version's own)"),
    },
    doc_md="""
### Deploy
The chosen pipeline's spec and its AI endpoints' connections are checked first, and for `start`
and `scale` that the version is one of its configurations. Each stage's fleet is a supervisord
program (`fleet-<run_id>-<stage>`): supervisord restarts a fleet that crashes or exits because a
member died, with back-off when it fails at start. The `deployments` table records each program
with its pid (the new one after a restart), metrics port, member count, supervisord state,
restarts and health. `scale` rewrites the AI stages' (the stages that call an AI endpoint)
programs with the new member count and restarts them; `check` refreshes the recorded state. With a
Kubernetes connection `fleet_default`, each fleet is a Deployment instead (docs/operations/
kubernetes.md).
""",
)
def pipeline_deploy() -> None:
    check = s.check_pipeline(version="{{ params.version if params.action in ('start', 'scale') else '' }}")
    check >> DeployFleetOperator(task_id="deploy", action="{{ params.action }}", run_id="{{ params.run_id }}",
                                 version="{{ params.version }}", members="{{ params.members }}")


pipeline_deploy()
