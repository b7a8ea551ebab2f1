"""Drive load through a configuration version and record the run."""

from __future__ import annotations

from airflow.sdk import Param

from pipeline_ops import dag_support as s
from pipeline_ops.operators.deploy import DeployFleetOperator
from pipeline_ops.operators.load import LoadTestOperator
from pipeline_ops.operators.topics import ProvisionTopicsOperator

RUN = "load-{{ ts_nodash | lower }}-v{{ params.version }}"


@s.pipeline_dag(
    "pipeline_load_test", "load",
    params={
        "pipeline": s.pipeline_param(),
        "version": Param(1, type="integer", minimum=1,
                         description="configuration version (registry) of the pipeline"),
        "burst": Param(320, type="integer", minimum=0, description="requests sent at once (0: use rate)"),
        "rate": Param(0.0, type="number", minimum=0, description="requests/s for `duration_s`"),
        "duration_s": Param(0.0, type="number", minimum=0, description="seconds of steady load"),
        "partitions": Param(16, type="integer", minimum=1, description="partitions of the run's topics"),
        "concurrency": Param(16, type="integer", minimum=1,
                             description="AI stand-in concurrency limit (ignored for a real endpoint)"),
        "profile": s.profile_param(),
    },
    doc_md="""
### Load test
The chosen pipeline's spec, its AI endpoints' connections and that the version is one of its
configurations are checked first; then fresh topics for the run, the version's fleets deployed, a
burst or a steady rate of requests, and a wait until every request reached a final state. Records
land in the run tables under `load-<timestamp>-v<version>`; analyse them with
`pipeline_skew_analysis`.
""",
)
def pipeline_load_test() -> None:
    check = s.check_pipeline(version="{{ params.version }}")
    provision = ProvisionTopicsOperator(task_id="provision", pipeline="{{ params.pipeline }}", prefix=RUN,
                                        profile="{{ params.profile }}", partitions="{{ params.partitions }}")
    deploy = DeployFleetOperator(task_id="deploy", action="start", run_id=RUN, version="{{ params.version }}",
                                 ai_limit="{{ params.concurrency }}")
    load = LoadTestOperator(task_id="load_test", run_id=RUN, version="{{ params.version }}",
                            burst="{{ params.burst }}", rate="{{ params.rate }}",
                            duration_s="{{ params.duration_s }}")
    stop = DeployFleetOperator(task_id="stop_fleets", action="stop", run_id=RUN, trigger_rule="all_done")
    check >> provision >> deploy >> load >> stop


pipeline_load_test()
