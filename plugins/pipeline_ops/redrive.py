"""The redrive as an Airflow task: the DAG run's form decides which dead letters go back, and the
user who triggered the run is kept with each (`consumers.runs.redrive` does the work)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from consumers.runs import redrive
from pipeline_ops.connections import database_url, kafka_access

# Who a run without a triggering user (a scheduled or asset-triggered one) is recorded as.
SCHEDULER = "scheduler"


def requested_by(context: Any) -> str:
    """The user who triggered the run (the REST API's login, `dag_test` under `airflow dags
    test`), else the scheduler."""
    dag_run = context.get("dag_run")
    return getattr(dag_run, "triggering_user_name", None) or SCHEDULER


def _listed(value: Sequence[str] | str) -> tuple[str, ...]:
    """A list field, as given or as the JSON its template rendered (`| tojson`)."""
    return tuple(json.loads(value) if isinstance(value, str) else value)


class RedriveOperator(BaseOperator):
    """Send a pipeline's selected dead letters back to their source topics; returns the summary
    (`selected` and a count per outcome) for XCom. A bad selection fails the task without retry;
    a delivery that fails is retried by the task's retry, which sends the unconfirmed record
    first."""

    template_fields = ("pipeline", "run", "stages", "reasons", "since", "until", "limit", "rate",
                       "max_redrives")

    def __init__(self, *, pipeline: str, run: str = "", stages: Sequence[str] | str = (),
                 reasons: Sequence[str] | str = (), since: str = "", until: str = "",
                 limit: int | str = 100, rate: float | str = 20.0, max_redrives: int | str = 3,
                 kafka_config_id: str = "kafka_default", postgres_conn_id: str = "postgres_default",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline, self.run, self.stages, self.reasons = pipeline, run, stages, reasons
        self.since, self.until, self.limit, self.rate = since, until, limit, rate
        self.max_redrives = max_redrives
        self.kafka_config_id, self.postgres_conn_id = kafka_config_id, postgres_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        try:
            selection = redrive.Selection(
                self.pipeline, str(self.run or ""), _listed(self.stages), _listed(self.reasons),
                redrive.timestamp(str(self.since or "")), redrive.timestamp(str(self.until or "")),
                int(self.limit), int(self.max_redrives))
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from None
        who = requested_by(context)
        self.log.info("redrive of %s by %s: %s", self.pipeline, who, selection)
        summary = redrive.redrive(selection, kafka_access(self.kafka_config_id).default,
                                  database_url(self.postgres_conn_id), who, float(self.rate),
                                  batch=context["run_id"])
        self.log.info("%s", summary)
        return summary
