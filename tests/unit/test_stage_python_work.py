"""A team's own Python work fails per record: retried by the stage's policy, then dead-lettered
with its exception; an exception the spec declares a dependency's makes the record wait."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from consumers.config import events, pipeline_spec
from consumers.runtime import stages
from consumers.runtime.failures import POISON, TRANSIENT, Verdict, WorkFailed, classify
from consumers.runtime.storage import Origin
from tests import custom_work

SPEC = pipeline_spec.parse(yaml.safe_load(custom_work.SPEC), "wordcount")


class Storage:
    """What a stage without AI work writes: the request taken, the result recorded."""

    def __init__(self) -> None:
        self.results: list[dict | None] = []

    def take(self, *args: Any, **kwargs: Any) -> tuple[dict, None]:
        return {}, None

    def record_result(self, key: Any, stage: str, result: dict | None, *args: Any) -> bool:
        self.results.append(result)
        return True

    def mark_notified(self, key: Any) -> None:
        pass


class Discarded:
    """An outbox that drops what it is handed: these tests look at what the stage recorded."""

    def deliver(self, *args: Any) -> None:
        pass


def run(text: str, state: stages.RecordState, storage: Storage) -> Exception | None:
    ctx = stages.StageContext(stage="count", topics=events.Topics("p", SPEC), storage=storage,  # type: ignore[arg-type]
                              outbox=Discarded())
    event = {"message_id": "m1", "run_id": "r", "text": text, "produced_at": 1.7e9}
    try:
        stages.handle(ctx, event, Origin("count-0", "p.texts", 0, 1), state)
    except Exception as exc:  # noqa: BLE001 - the test classifies it
        return exc
    return None


def test_a_raising_work_is_tried_max_attempts_times_then_dead_lettered() -> None:
    state, storage = stages.RecordState(), Storage()
    verdicts = [classify(run("boom", state, storage)) for _ in range(3)]  # type: ignore[arg-type]
    assert [v.kind for v in verdicts] == [TRANSIENT, TRANSIENT, POISON]  # retry.max_attempts: 3
    failure = run("boom", state, storage)
    assert isinstance(failure, WorkFailed) and classify(failure) == Verdict(POISON, "work_failed")
    assert failure.reason == "builtins.ValueError: cannot count the words of m1"
    assert storage.results == []


def test_an_exception_declared_transient_waits_without_using_the_tries() -> None:
    state, storage = stages.RecordState(), Storage()
    for _ in range(5):
        failure = run("db-down", state, storage)
        assert classify(failure).kind == TRANSIENT  # type: ignore[arg-type]
    assert state.work_failures == 0
    assert run("two words", state, storage) is None
    assert storage.results == [{"words": 2}]


def test_the_spec_check_names_a_transient_reference_that_is_not_an_exception() -> None:
    document = yaml.safe_load(custom_work.SPEC)
    document["stages"]["count"]["work"]["transient"] = ["tests.custom_work:count_words"]
    with pytest.raises(pipeline_spec.SpecError, match=r"work\.transient\.0"):
        pipeline_spec.parse(document, "wordcount")


def test_a_python_stage_may_send_the_failure_notice_so_it_is_among_its_outputs() -> None:
    # The outputs are what a secured cluster's grants give the stage's principal.
    document = yaml.safe_load(custom_work.SPEC)
    document["topics"]["notices"] = {"key": "message_id"}
    document["failure_notice"] = {"to": "notices"}
    spec = pipeline_spec.parse(document, "wordcount")
    assert spec.outputs_of("count") == ["counts", "notices"]
