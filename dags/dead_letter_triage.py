"""Dead-letter triage, woken by bursts on the dead-letter topics: counts, alarm, redrive.

The watcher (`pipeline_ops.dead_letter_watch`) fires one asset event per burst; the run waits
for the burst's window to close, counts from the table (`pipeline_ops.triage`: why no letter is
lost or counted twice), and sends `ai_unavailable` letters back through `pipeline_redrive` once
their endpoint's circuit is closed. No `max_active_runs=1`: a run waiting for a circuit must not
hold back the next burst's event, and overlapping triages count one after the other.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.providers.standard.sensors.time_delta import TimeDeltaSensor
from airflow.sdk import Asset, AssetWatcher, Param, PokeReturnValue, get_current_context, task

from pipeline_ops import dag_support as s
from pipeline_ops import dead_letter_watch as watch
from pipeline_ops.triage import DEFAULT_THRESHOLD, Triage, raise_alarms

DEAD_LETTERS = Asset("kafka://pipeline/dead-letters",
                     watchers=[AssetWatcher(name="dead_letter_bursts", trigger=watch.trigger())])
CIRCUIT_WAIT = timedelta(hours=1)


@s.pipeline_dag(
    "dead_letter_triage", "dead-letters", schedule=DEAD_LETTERS,
    params={
        "alarm_threshold": Param(DEFAULT_THRESHOLD, type="integer", minimum=0,
                                 description="a pipeline with more new dead letters than this in one "
                                             "triage raises the alarm"),
        "auto_redrive": Param(True, type="boolean",
                              description="send ai_unavailable letters back once their endpoint's "
                                          "circuit is closed"),
    },
    doc_md=f"""
### Dead-letter triage
Runs on its own: the watcher of the dead-letter topics (`{watch.CONNECTION}` connection, topics
`{watch.watched_topics()}`) wakes it once per burst. `burst_over` waits until the burst's
{watch.WINDOW_S:.0f}-s window is closed; `count` counts every dead letter no triage has counted yet by
pipeline, stage and reason (`triage_runs`); `alarm` fails, naming them, when a pipeline has more
than `alarm_threshold`; `circuits_closed` waits (up to {CIRCUIT_WAIT}) until the endpoints of the
stages with `ai_unavailable` letters have closed circuits, and `redrive` triggers `pipeline_redrive`
for each such run and stage.
""",
)
def dead_letter_triage() -> None:
    burst_over = TimeDeltaSensor(task_id="burst_over", deferrable=True,
                                 delta=timedelta(seconds=watch.WINDOW_S + watch.ROW_MARGIN_S))

    @task
    def count() -> dict[str, Any]:
        context = get_current_context()
        return Triage().count_new(context["run_id"], context["params"]["alarm_threshold"])

    @task(retries=0)
    def alarm(summary: dict[str, Any]) -> None:
        raise_alarms(summary)

    @task.sensor(poke_interval=30, timeout=CIRCUIT_WAIT.total_seconds(), mode="reschedule", soft_fail=True)
    def circuits_closed(summary: dict[str, Any]) -> PokeReturnValue:
        if not get_current_context()["params"]["auto_redrive"]:
            return PokeReturnValue(is_done=True, xcom_value=[])
        done, confs = Triage().ready_redrives(summary)
        return PokeReturnValue(is_done=done, xcom_value=confs)

    summary = count()
    burst_over >> summary
    alarm(summary)
    TriggerDagRunOperator.partial(task_id="redrive", trigger_dag_id="pipeline_redrive").expand(
        conf=circuits_closed(summary))


dead_letter_triage()
