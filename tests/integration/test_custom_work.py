"""A team's own Python work under load on the real stack: a record it raises on is dead-lettered
once with its exception after the stage's tries, every other record completes, the fleet process
runs on and the group's committed offsets reach the end of the topic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.config import pipeline_spec
from consumers.config.candidate import Endpoints, PipelineConfig, StageConfig
from consumers.runs.pipeline_run import running_pipeline
from tests import custom_work
from tests.integration.kafka_helpers import wait_committed_to_end
from tests.integration.pipeline_fixtures import TIME_SCALE, query
from tests.stack import Stack

RECORDS = 200
RAISING = 2  # indices 42 and 142 of 200 (custom_work.posts)


@pytest.fixture
def wordcount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The pipelines folder: the project's specs plus the word-count one (the fleet's child
    process reads it from PIPELINES_DIR too)."""
    for shipped in pipeline_spec.directory().glob("*.yaml"):
        (tmp_path / shipped.name).write_text(shipped.read_text())
    (tmp_path / "wordcount.yaml").write_text(custom_work.SPEC)
    monkeypatch.setenv("PIPELINES_DIR", str(tmp_path))
    yield


def test_a_raising_work_dead_letters_its_records_and_the_stage_runs_on(stack: Stack, wordcount: None) -> None:
    config = PipelineConfig(pipeline="wordcount", partitions=4, time_scale=TIME_SCALE, replication_factor=1,
                            backoff_base_s=0.01,
                            stages={"count": StageConfig("flow", members=2, window=8)})
    # A fleet process that exited (a member that died) makes leaving `running_pipeline` raise.
    with running_pipeline(config, stack.kafka, stack.database_url, Endpoints({}),
                          fleet_processes=True) as pipeline:
        pipeline.send(RECORDS)
        counts = pipeline.wait_terminal(RECORDS, timeout_s=120)
        topic = pipeline.topics.source_of("count")
        # commits follow completions by a commit interval
        state = wait_committed_to_end(stack.connection, {topic: pipeline.topics.group_of("count")}, 30)
    assert counts == {"completed": RECORDS - RAISING, "dead_lettered": RAISING}
    letters = query(stack.database_url, "SELECT request_id, reason, "
                    "convert_from(payload, 'UTF8')::jsonb->>'text' FROM dead_letters WHERE run_id = %s",
                    pipeline.run_id)
    assert len(letters) == RAISING and len({request for request, _, _ in letters}) == RAISING
    for request, reason, text in letters:
        assert reason == f"work_failed: builtins.ValueError: cannot count the words of {request}"
        assert text == "boom"
    committed, left = state[topic]
    assert left == 0 and len(committed) == 4, state  # every record of every partition handled
