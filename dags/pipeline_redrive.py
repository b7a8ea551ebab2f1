"""Send a pipeline's dead letters back to their source topics: after an outage, a fixed bug or a
raised limit."""

from __future__ import annotations

from airflow.sdk import Param

from pipeline_ops import dag_support as s
from pipeline_ops.redrive import RedriveOperator

TIMESTAMP = "ISO-8601, e.g. 2026-03-01T10:00:00Z (no offset: UTC); empty: no bound"


@s.pipeline_dag(
    "pipeline_redrive", "dead-letters",
    params={
        "pipeline": s.pipeline_param(),
        "run": Param("", type="string", description="a run id, or a prefix of run ids; empty: any run"),
        "stages": Param([], type="array", items={"type": "string"},
                        description="stages whose dead letters go back; empty: every stage"),
        "reasons": Param([], type="array", items={"type": "string"},
                         description="reason codes (ai_unavailable, ai_bad_answer, work_failed, ...); "
                                     "empty: any reason"),
        "since": Param("", type="string", description=f"dead-lettered at or after: {TIMESTAMP}"),
        "until": Param("", type="string", description=f"dead-lettered before: {TIMESTAMP}"),
        "limit": Param(100, type="integer", minimum=1,
                       description="at most this many dead letters, oldest first"),
        "rate": Param(20.0, type="number", exclusiveMinimum=0, description="records sent back per second"),
        "max_redrives": Param(3, type="integer", minimum=0,
                              description="a record already sent back this many times is skipped"),
    },
    doc_md="""
### Redrive
The chosen pipeline's spec is checked first. Then its selected dead letters go back to the topic
each came from, with its original key and value and the headers `redrive_count` (a fresh try
budget for the record) and `dead_letter_id`, at the form's rate. Skipped and counted in the
summary (the task's XCom): a letter whose request has a result for that stage since
(`skipped_done`), one already sent back `max_redrives` times (`skipped_limit`), one stored as a
prefix because it was too large (`skipped_reference`). Every letter considered is a row of
`redrives` with the user who triggered the run; a letter that went back is not selected again,
so running the same selection twice sends nothing the second time. The same from a shell:
`python -m consumers.runs.redrive --pipeline ... [--run ...] [--reason ...]`.
""",
)
def pipeline_redrive() -> None:
    s.check_pipeline() >> RedriveOperator(
        task_id="redrive", pipeline="{{ params.pipeline }}", run="{{ params.run }}",
        stages="{{ params.stages | tojson }}", reasons="{{ params.reasons | tojson }}",
        since="{{ params.since }}", until="{{ params.until }}", limit="{{ params.limit }}",
        rate="{{ params.rate }}", max_redrives="{{ params.max_redrives }}")


pipeline_redrive()
