"""The first task of every DAG that runs a pipeline: its spec and its connections checked."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from pipeline_ops import pipeline_check
from pipeline_ops.registry import ConfigRegistry


class CheckPipelineOperator(BaseOperator):
    """Refuse the chosen spec before anything is provisioned (a mistake in it, an endpoint whose
    connection is not defined: the task fails with each field at fault, and is not retried), and
    return what later tasks' templates need of it (its completing stage, its measured topic).
    With a `version`, that registered configuration must be one of this pipeline."""

    template_fields = ("pipeline", "version")

    def __init__(self, *, pipeline: str, version: int | str | None = None,
                 postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline, self.version, self.postgres_conn_id = pipeline, version, postgres_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        try:
            spec = pipeline_check.validated(self.pipeline)
            version = int(self.version or 0)  # rendered templates are text: "" or "0" means none
            if version:
                ConfigRegistry(self.postgres_conn_id).get(version, spec.name)
        except ValueError as exc:  # SpecError is one, as is a version of another pipeline
            raise AirflowFailException(str(exc)) from None
        self.log.info("pipeline %s", spec.summary())
        return {"pipeline": spec.name, "completing_stage": spec.completing_stage,
                "measure": spec.load.measure}
