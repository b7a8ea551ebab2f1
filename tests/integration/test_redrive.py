"""Redrive against the real broker, PostgreSQL and Airflow: the AI stand-in fails chosen requests
while serving the rest, so they are dead-lettered as `ai_unavailable`; once the rule is lifted
they go back through `airflow dags test pipeline_redrive` and the command line, and every request
completes with no AI call served twice, a second redrive of the same selection sends nothing, and
the limit holds."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import psycopg2
import pytest

from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.runs.pipeline_run import Pipeline, running_pipeline
from tests.integration.pipeline_fixtures import TIME_SCALE, AIService, ai_service, query
from tests.stack import REPO, DagTestRun, Stack

COUNT = 40
CONFIG = PipelineConfig(partitions=4, time_scale=TIME_SCALE, replication_factor=1,
                        stages={"check": StageConfig("flow", members=1, window=8),
                                "generate": StageConfig("flow", members=1, window=8)})


@pytest.fixture(scope="module")
def ai() -> Iterator[AIService]:
    with ai_service() as service:
        yield service


def only(*request_ids: str) -> dict[str, str]:
    """A stand-in rule failing exactly these requests."""
    return {"request_id": "^(" + "|".join(request_ids) + ")$"}


def eventually(read: Callable[[], object], expected: object, timeout_s: float = 90.0) -> None:
    """Until `read()` gives `expected`; fails with the last value read."""
    deadline = time.monotonic() + timeout_s
    while (value := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.25)
    assert value == expected


def batch_of(stack: Stack, run: DagTestRun) -> str:
    """The Airflow run id of a DAG test run: the batch its redrive rows carry."""
    with psycopg2.connect(stack.layout.database_url("airflow")) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id FROM dag_run WHERE dag_id = 'pipeline_redrive' AND logical_date = %s",
                    (run.logical_date,))
        run_id = cur.fetchone()[0]
    conn.close()
    return run_id


def redrives_of(stack: Stack, batch: str) -> list[tuple]:
    return query(stack.database_url, "SELECT d.request_id, d.stage, x.outcome, x.round, x.requested_by "
                 "FROM redrives x JOIN dead_letters d ON d.id = x.dead_letter_id WHERE x.batch = %s "
                 "ORDER BY d.request_id, d.redrive", batch)


def records_in(stack: Stack, pipeline: Pipeline) -> dict[str, int]:
    """Records on the topics a redrive writes: the AI stages' inputs."""
    return {topic: sum(stack.connection.partition_counts(pipeline.topics.name(topic)))
            for topic in ("style", "generate")}


def test_dead_letters_of_chosen_requests_are_redriven_once_each_within_the_limit(
        stack: Stack, ai: AIService) -> None:
    ai.reset()
    with running_pipeline(CONFIG, stack.kafka, stack.database_url, ai.endpoints, stages=()) as topics_only:
        sent = topics_only.send(COUNT)  # the requests wait in their topics: their ids pick the rules
    run_id = topics_only.run_id
    checked_out, *generated_out = sent.request_ids[:4]
    held = generated_out[0]  # fails again after the first redrive
    ai.configure(check={"fail_when": only(checked_out)}, generate={"fail_when": only(*generated_out)})

    with running_pipeline(CONFIG, stack.kafka, stack.database_url, ai.endpoints, run_id=run_id) as pipeline:
        assert pipeline.wait_terminal(COUNT, timeout_s=120) == {"completed": COUNT - 4, "dead_lettered": 4}
        letters = query(stack.database_url, "SELECT request_id, stage, split_part(reason, ':', 1), redrive, "
                        "kafka_key IS NOT NULL FROM dead_letters WHERE run_id = %s ORDER BY id", run_id)
        assert sorted(letters) == sorted([
            (checked_out, "check", "ai_unavailable", 0, True),
            *((r, "generate", "ai_unavailable", 0, True) for r in generated_out)])

        # The endpoint serves all but one again; the first redrive lets a record go back once.
        ai.configure(check={"fail_when": {}}, generate={"fail_when": only(held)})
        conf = json.dumps({"pipeline": "genai_image", "run": run_id, "reasons": ["ai_unavailable"],
                           "max_redrives": 1, "rate": 50})
        first = stack.run_dag("pipeline_redrive", conf=conf)
        assert first.state == "success", first.output[-4000:]
        assert redrives_of(stack, batch_of(stack, first)) == sorted(
            (r, "check" if r == checked_out else "generate", "redriven", 1, "dag_test")
            for r in sent.request_ids[:4])

        def progress() -> tuple[dict[str, int], int]:
            letters = query(stack.database_url, "SELECT count(*) FROM dead_letters WHERE run_id = %s", run_id)
            return pipeline.status_counts(), letters[0][0]

        eventually(progress, ({"completed": COUNT - 1, "dead_lettered": 1}, 5))
        again = query(stack.database_url, "SELECT stage, redrive FROM dead_letters WHERE request_id = %s "
                      "ORDER BY id", held)
        assert again == [("generate", 0), ("generate", 1)]  # its round went back and came back

        # The same selection again, from the command (the DAG's selection and limit are its
        # code; an Airflow start costs a run here): what went back is not selected, the held one
        # is at the limit. A raised limit (the command's default, 3) lets it through; once more
        # does nothing.
        ai.configure(generate={"fail_when": {}})
        before = records_in(stack, pipeline)
        command = [sys.executable, "-m", "consumers.runs.redrive", "--pipeline", "genai_image",
                   "--run", run_id, "--reason", "ai_unavailable", "--by", "redrive-test"]
        summaries = []
        for limit in (["--max-redrives", "1"], [], []):
            done = subprocess.run(command + limit, env=stack.subprocess_env(), cwd=REPO, capture_output=True,
                                  text=True, timeout=120, check=True)
            summaries.append(json.loads(done.stdout))
            if limit:
                assert records_in(stack, pipeline) == before
            else:
                eventually(pipeline.status_counts, {"completed": COUNT})
        counts = [{k: s[k] for k in ("selected", "redriven", "skipped_done", "skipped_limit",
                                     "skipped_reference")} for s in summaries]
        assert counts == [{"selected": 1, "redriven": 0, "skipped_done": 0, "skipped_limit": 1,
                           "skipped_reference": 0},
                          {"selected": 1, "redriven": 1, "skipped_done": 0, "skipped_limit": 0,
                           "skipped_reference": 0},
                          {"selected": 0, "redriven": 0, "skipped_done": 0, "skipped_limit": 0,
                           "skipped_reference": 0}]
        assert redrives_of(stack, summaries[0]["batch"]) == [
            (held, "generate", "skipped_limit", 2, "redrive-test")]
        assert redrives_of(stack, summaries[1]["batch"]) == [
            (held, "generate", "redriven", 2, "redrive-test")]

    stats = ai.stats()
    assert (stats["check"]["distinct_served"], stats["generate"]["distinct_served"]) == (COUNT, COUNT)
    assert (stats["check"]["duplicate_served"], stats["generate"]["duplicate_served"]) == (0, 0)
    settled = query(stack.database_url, "SELECT status, entries, finished_at IS NOT NULL, "
                    "notified_at IS NOT NULL, count(*) FROM requests WHERE run_id = %s GROUP BY 1, 2, 3, 4",
                    run_id)
    assert settled == [("completed", 2, True, True, COUNT)]  # the check letter's count was undone
    # Each record went back with its key: to the partition it was dead-lettered from.
    moved = query(stack.database_url, "SELECT count(*) FROM redrives x JOIN dead_letters d ON "
                  "d.id = x.dead_letter_id WHERE d.run_id = %s AND x.outcome = 'redriven' AND "
                  "x.sent_partition IS DISTINCT FROM d.kafka_partition", run_id)
    assert moved == [(0,)]
    served_twice = query(stack.database_url, "SELECT request_id, stage FROM ai_attempts WHERE run_id = %s "
                         "AND outcome = 'ok' GROUP BY 1, 2 HAVING count(*) > 1", run_id)
    assert served_twice == []
