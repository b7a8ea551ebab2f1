"""Dead-letter triage on the real stack: a burst of dead letters on a watched topic wakes exactly
one `dead_letter_triage` run in a real Airflow (standalone: its triggerer runs the watcher), which
counts them by pipeline, stage and reason and raises the alarm past the threshold; a run's
`ai_unavailable` letters go back through `pipeline_redrive` once its endpoint's circuit closes;
and on PostgreSQL alone, a dead letter whose transaction commits after a later one is still
counted, by exactly one triage.

The watcher follows only this module's topics (`DEAD_LETTER_TOPICS`), so other tests' dead
letters on the shared cluster wake nothing here; their rows may be counted by the run, which is
why the checks look at this module's own pipeline name.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg2
import pytest
from confluent_kafka import KafkaException, Producer

from consumers.config.pipeline_spec import DEAD_LETTER
from consumers.runtime import dead_letter
from consumers.runtime.storage import Origin, Storage
from pipeline_ops.triage import Triage
from tests.integration.conftest import TRIAGE_PREFIX
from tests.integration.kafka_helpers import create_topic, wait_committed_to_end
from tests.integration.pipeline_fixtures import query
from tests.integration.test_airflow_ui import Api, password  # noqa: F401 (password: a fixture)
from tests.stack import Stack, unique

DAG_ID = "dead_letter_triage"
REDRIVE_DAG_ID = "pipeline_redrive"
ASSET_URI = "kafka://pipeline/dead-letters"
PREFIX = TRIAGE_PREFIX  # the runs the shared Airflow's watcher follows: <PREFIX>-<n>.dlq
BURST = {("intake", "malformed_json"): 70, ("generate", "work_failed"): 50}  # 120 > the default 100
RUN_TIMEOUT_S = 300
PARTITIONS = 2  # of each dead-letter topic the watcher follows


@pytest.fixture(scope="module")
def airflow(standalone_airflow: str) -> str:
    return standalone_airflow


@pytest.fixture
def api(airflow: str, password: str) -> Api:  # noqa: F811
    return Api(airflow, "admin", password)


@pytest.fixture
def triage_on(api: Api) -> Iterator[None]:
    """The DAG unpaused (its watcher runs only then), paused again afterwards: an Airflow started
    later on this stack must not watch every dead-letter topic of the cluster. What an earlier
    session left in the metadata database (a run not finished, an event queued) is failed or
    dropped first: such a run would start on unpausing and count this test's letters first."""
    api.fail_unfinished(DAG_ID)
    dropped = api.session.delete(f"{api.base_url}/api/v2/dags/{DAG_ID}/assets/queuedEvents", timeout=30)
    assert dropped.status_code in (204, 404), dropped.text  # 404: none queued
    api.patch(f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    yield
    api.patch(f"/api/v2/dags/{DAG_ID}", {"is_paused": True})


def watcher_group(stack: Stack) -> str:
    """The watcher's consumer group, from its connection as the stack defines it."""
    return json.loads(stack.env["AIRFLOW_CONN_KAFKA_DEAD_LETTER_WATCH"])["extra"]["group.id"]


def wait_assigned(stack: Stack, group: str, topic: str, timeout_s: float) -> None:
    """Until a member of `group` has every partition of `topic`: the watcher is consuming it. A
    group its coordinator cannot describe yet (loading, or just moved on a new cluster) has none."""
    admin = stack.connection.admin()
    deadline = time.monotonic() + timeout_s
    assigned: set[int] = set()
    while time.monotonic() < deadline:
        try:
            description = admin.describe_consumer_groups([group])[group].result(10)
        except KafkaException:
            time.sleep(1)
            continue
        assigned = {tp.partition for m in description.members for tp in m.assignment.topic_partitions
                    if tp.topic == topic}
        if assigned == set(range(PARTITIONS)):
            return
        time.sleep(1)
    pytest.fail(f"the watcher's group {group} has partitions {sorted(assigned)} of {topic} "
                f"after {timeout_s}s")


def send_burst(stack: Stack, pipeline: str, run_id: str, burst: dict[tuple[str, str], int]) -> float:
    """The runtime's part: each dead letter (`burst`: how many per stage and reason) to the run's
    dead-letter topic, then its row. Returns the seconds the records took to be sent and
    acknowledged."""
    topic = f"{run_id}.{DEAD_LETTER}"
    producer = Producer(stack.connection.client())
    letters = [(stage, reason) for (stage, reason), count in burst.items() for _ in range(count)]
    started = time.monotonic()
    for i, (stage, reason) in enumerate(letters):
        record = dead_letter.build(f'{{"request_id": "r{i}"}}'.encode(), f"r{i}".encode(), [], reason=reason,
                                   detail="burst", topic=f"{run_id}.{stage}", partition=0, offset=i,
                                   stage=stage)
        producer.produce(topic, value=record.value, key=record.key, headers=record.headers)
    assert producer.flush(30) == 0
    took = time.monotonic() - started
    storage = Storage(stack.database_url, pool_size=1)
    try:
        for i, (stage, reason) in enumerate(letters):
            storage.record_dead_letter(pipeline, run_id, None, stage, f"{reason}: burst",
                                       Origin("test", f"{run_id}.{stage}", 0, i), None)
    finally:
        storage.close()
    return took


def iso(at: datetime) -> str:
    """A UTC time as a query parameter takes it (a "+" would arrive as a space)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def runs_since(api: Api, since: datetime) -> list[dict[str, Any]]:
    return api.get(f"/api/v2/dags/{DAG_ID}/dagRuns?run_after_gte={iso(since)}")["dag_runs"]


def wait_first_run(api: Api, since: datetime, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if runs := runs_since(api, since):
            return runs[0]
        time.sleep(1)
    pytest.fail(f"no {DAG_ID} run within {timeout_s}s of the burst")


FINISHED = ("success", "failed", "skipped", "upstream_failed")


def wait_tasks(api: Api, run_id: str, task_ids: tuple[str, ...], timeout_s: float,
               states_wanted: tuple[str, ...] = FINISHED) -> dict[str, str]:
    """The states of the run's tasks once the given ones are in one of `states_wanted`."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
        states = {t["task_id"]: t["state"] for t in tasks}
        if all(states.get(t) in states_wanted for t in task_ids):
            return states
        if time.monotonic() > deadline:
            pytest.fail(f"{task_ids} of {run_id} not in {states_wanted} after {timeout_s}s: {states}")
        time.sleep(0.5)


def mine(counts: list[dict[str, Any]], pipeline: str) -> dict[tuple[str, str], int]:
    return {(c["stage"], c["reason"]): c["letters"] for c in counts if c["pipeline"] == pipeline}


@pytest.mark.timeout(900)
def test_a_burst_of_dead_letters_wakes_exactly_one_triage_run(stack: Stack, api: Api,
                                                               triage_on: None) -> None:
    run_id = f"{PREFIX}-1"
    topic = f"{run_id}.{DEAD_LETTER}"
    pipeline = PREFIX
    create_topic(stack.connection, topic, partitions=PARTITIONS)
    group = watcher_group(stack)
    wait_assigned(stack, group, topic, timeout_s=300)
    Triage().count_new(f"before-{run_id}")  # what others dead-lettered so far: a triage before ours
    since = datetime.now(UTC)

    took = send_burst(stack, pipeline, run_id, BURST)
    assert took < 1.0, f"the burst took {took:.2f}s to send"

    run = wait_first_run(api, since, timeout_s=120)
    assert run["run_type"] == "asset_triggered"
    # Every record's offset is committed only once the event it gave (if any) is stored, so at
    # the end offsets every event the burst will ever give is in the metadata database.
    state = wait_committed_to_end(stack.connection, {topic: group}, timeout_s=120)
    assert state[topic][1] == 0, f"the watcher did not commit the burst: {state}"
    asset = api.get(f"/api/v2/assets?uri_pattern={ASSET_URI}")["assets"]
    asset_id = next(a["id"] for a in asset if a["uri"] == ASSET_URI)
    events = api.get(f"/api/v2/assets/events?asset_id={asset_id}&timestamp_gte={iso(since)}")
    assert events["total_entries"] == 1, events
    assert [r["dag_run_id"] for r in runs_since(api, since)] == [run["dag_run_id"]]
    # The run takes every event since the DAG's previous asset-triggered run, so older ones an
    # earlier session left may come with it; of this burst's, it has the one.
    consumed = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}/upstreamAssetEvents")
    assert [e["id"] for e in consumed["asset_events"]
            if datetime.fromisoformat(e["timestamp"]) >= since] == [events["asset_events"][0]["id"]]

    states = wait_tasks(api, run["dag_run_id"], ("count", "alarm"), RUN_TIMEOUT_S)
    assert [states[t] for t in ("burst_over", "count", "alarm")] == ["success", "success", "failed"], states
    summary = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}/taskInstances/count/"
                      "xcomEntries/return_value")["value"]
    assert mine(summary["counts"], pipeline) == {("generate", "work_failed"): 50,
                                                 ("intake", "malformed_json"): 70}
    assert summary["alarms"][pipeline] == 120
    [(row_counts, row_alarms)] = query(stack.database_url, "SELECT counts, alarms FROM triage_runs "
                                                           "WHERE dag_run_id = %s", run["dag_run_id"])
    assert (mine(row_counts, pipeline), row_alarms[pipeline]) == (mine(summary["counts"], pipeline), 120)


def record_circuit(database_url: str, run_id: str, stage: str, state: str) -> None:
    """What the fleet writes on a transition of its endpoint's circuit."""
    with contextlib.closing(psycopg2.connect(database_url)) as conn, conn, conn.cursor() as cur:
        cur.execute("INSERT INTO endpoint_circuits (run_id, stage, endpoint, state) VALUES (%s, %s, %s, %s)",
                    (run_id, stage, stage, state))


def wait_counted(stack: Stack, run_id: str, timeout_s: float) -> str:
    """The triage run that counted the run's `ai_unavailable` letters, once one has."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = query(stack.database_url, "SELECT dag_run_id FROM triage_runs WHERE redrives @> %s::jsonb",
                     json.dumps([{"run": run_id}]))
        if rows:
            return rows[0][0]
        time.sleep(1)
    pytest.fail(f"no triage counted the ai_unavailable letters of {run_id} within {timeout_s}s")


@pytest.mark.timeout(900)
def test_ai_unavailable_letters_go_back_once_the_circuit_is_closed_again(stack: Stack, api: Api,
                                                                         triage_on: None) -> None:
    """A run's generate endpoint failed requests while serving others, and its circuit is open
    when triage runs: the redrive waits for the circuit to close, then triggers `pipeline_redrive`
    for that run, stage and reason. The run's topic is created only now, while the watcher is
    running (or waiting for a first topic to match): its pattern finds it."""
    run_id = f"{PREFIX}-2"
    pipeline = "genai_image"  # pipeline_redrive takes a pipeline with a spec
    Triage().count_new(f"before-{run_id}")
    record_circuit(stack.database_url, run_id, "generate", "open")
    since = datetime.now(UTC)
    create_topic(stack.connection, f"{run_id}.{DEAD_LETTER}", partitions=PARTITIONS)
    send_burst(stack, pipeline, run_id, {("generate", "ai_unavailable"): 5, ("check", "ai_bad_answer"): 2})

    dag_run_id = wait_counted(stack, run_id, timeout_s=180)
    wait_tasks(api, dag_run_id, ("circuits_closed",), RUN_TIMEOUT_S, ("up_for_reschedule",))
    triggered = api.get(f"/api/v2/dags/{REDRIVE_DAG_ID}/dagRuns?run_after_gte={iso(since)}")["dag_runs"]
    assert [r for r in triggered if r["conf"].get("run") == run_id] == []  # not while it is open
    record_circuit(stack.database_url, run_id, "generate", "closed")

    states = wait_tasks(api, dag_run_id, ("circuits_closed", "redrive"), RUN_TIMEOUT_S)
    assert (states["circuits_closed"], states["redrive"]) == ("success", "success"), states
    triggered = api.get(f"/api/v2/dags/{REDRIVE_DAG_ID}/dagRuns?run_after_gte={iso(since)}")["dag_runs"]
    confs = [r["conf"] for r in triggered if r["conf"].get("run") == run_id]
    [(first_at,)] = query(stack.database_url, "SELECT min(at) FROM dead_letters WHERE run_id = %s "
                                              "AND reason LIKE 'ai_unavailable:%%'", run_id)
    assert confs == [{"pipeline": pipeline, "run": run_id, "stages": ["generate"],
                      "reasons": ["ai_unavailable"], "since": first_at.isoformat(), "until": "", "limit": 5}]


def insert_letter(conn: Any, pipeline: str, stage: str, offset: int) -> int:
    with conn.cursor() as cur:
        cur.execute("INSERT INTO dead_letters (pipeline, run_id, stage, reason, source_topic, "
                    "kafka_partition, kafka_offset) VALUES (%s, %s, %s, 'work_failed: late', %s, 0, %s) "
                    "RETURNING id",
                    (pipeline, pipeline, stage, f"{pipeline}.{stage}", offset))
        return cur.fetchone()[0]


def wait_lock_waiter(database_url: str, timeout_s: float) -> None:
    """Until a session waits for a lock on `dead_letters` (the triage behind an open writer)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query(database_url, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                               "AND query LIKE 'LOCK TABLE dead_letters%%'"):
            return
        time.sleep(0.05)
    pytest.fail("no triage waited for the open dead-letter transaction")


def test_a_letter_committed_after_a_later_one_is_counted_once(stack: Stack) -> None:
    """Letter A gets its id first but commits last; B commits in between. The triage started
    between them waits for A's transaction, then counts both; the next counts neither."""
    pipeline = unique("triage-late")
    slow = psycopg2.connect(stack.database_url)
    fast = psycopg2.connect(stack.database_url)
    try:
        first = insert_letter(slow, pipeline, "intake", 0)  # not committed yet
        second = insert_letter(fast, pipeline, "intake", 1)
        fast.commit()
        assert second > first
        found: dict[str, Any] = {}
        counting = threading.Thread(target=lambda: found.update(Triage().count_new(f"{pipeline}-1")))
        counting.start()
        wait_lock_waiter(stack.database_url, timeout_s=30)
        slow.commit()
        counting.join(60)
    finally:
        slow.close()
        fast.close()
    assert mine(found["counts"], pipeline) == {("intake", "work_failed"): 2}
    assert found["after_id"] < first < second <= found["through_id"]
    again = Triage().count_new(f"{pipeline}-1")  # a retried task: its own row, nothing counted anew
    assert again == found
    assert mine(Triage().count_new(f"{pipeline}-2")["counts"], pipeline) == {}
