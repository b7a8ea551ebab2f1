"""What a redrive does with each dead letter, its headers and pace, the selection a command line
or a DAG run's form makes, and who it records as asking (no services: the rows and the sends
are the integration test's, tests/integration/test_redrive.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from consumers.config.pipeline_spec import load
from consumers.runs import redrive
from consumers.runs.redrive import REDRIVEN, SKIPPED_DONE, SKIPPED_LIMIT, SKIPPED_REFERENCE, Letter, Pacer
from consumers.runtime.dead_letter import STORED_PAYLOAD_BYTES
from pipeline_ops.redrive import RedriveOperator, requested_by


def letter(redrive_round: int = 0, done: bool = False, payload: bytes | None = b'{"request_id": "r1"}',
           key: bytes | None = b"k1") -> Letter:
    return Letter(id=42, request_id="r1", stage="generate", source_topic="run-1.generate", key=key,
                  payload=payload, redrive=redrive_round, done=done)


@pytest.mark.parametrize(("kwargs", "max_redrives", "expected"), [
    ({}, 3, REDRIVEN),
    ({"redrive_round": 2}, 3, REDRIVEN),  # goes back in its third round, the last one allowed
    ({"redrive_round": 3}, 3, SKIPPED_LIMIT),
    ({"redrive_round": 5}, 3, SKIPPED_LIMIT),
    ({}, 0, SKIPPED_LIMIT),  # a limit of 0 sends nothing back
    ({"done": True}, 3, SKIPPED_DONE),
    ({"done": True, "redrive_round": 3}, 3, SKIPPED_DONE),  # a result beats the limit
    ({"payload": b"x" * STORED_PAYLOAD_BYTES}, 3, SKIPPED_REFERENCE),  # a prefix of a longer value
    ({"payload": b"x" * (STORED_PAYLOAD_BYTES - 1)}, 3, REDRIVEN),
    ({"payload": None}, 3, SKIPPED_REFERENCE),  # no value to send
    ({"payload": None, "redrive_round": 3}, 3, SKIPPED_LIMIT),  # the limit beats the value
])
def test_each_letter_gets_the_first_outcome_that_holds(kwargs: dict, max_redrives: int,
                                                        expected: str) -> None:
    assert redrive.outcome(letter(**kwargs), max_redrives) == expected


def test_a_redriven_record_carries_its_next_round_and_its_dead_letter() -> None:
    assert letter().headers() == [("redrive_count", b"1"), ("dead_letter_id", b"42")]
    assert letter(redrive_round=2).headers() == [("redrive_count", b"3"), ("dead_letter_id", b"42")]


class Clock:
    """A clock that only sleeps move."""

    def __init__(self) -> None:
        self.now, self.slept = 100.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 9))
        self.now += seconds


def test_sends_are_spaced_at_the_rate_and_a_late_one_is_not_made_up_for() -> None:
    clock = Clock()
    pacer = Pacer(4.0, clock=clock, sleep=clock.sleep)  # one send every 0.25 s
    pacer.wait()  # the first goes at once (t = 100)
    clock.now += 0.1  # its delivery took 0.1 s
    pacer.wait()  # waits until t = 100.25
    pacer.wait()  # until t = 100.5
    clock.now += 2.0  # skipped letters, a slow delivery: t = 102.5
    pacer.wait()  # late: goes at once, no burst after it
    pacer.wait()  # t = 102.75
    assert clock.slept == [0.15, 0.25, 0.25]
    assert clock.now == pytest.approx(102.75)


@pytest.mark.parametrize("rate", [0, -1])
def test_a_rate_must_be_positive(rate: float) -> None:
    with pytest.raises(ValueError, match="rate must be positive"):
        Pacer(rate)


def test_the_command_line_makes_the_selection() -> None:
    args = redrive._parser().parse_args([
        "--pipeline", "genai_image", "--run", "run-", "--stage", "check", "--stage", "generate",
        "--reason", "ai_unavailable", "--since", "2026-03-01T10:00:00+02:00", "--until", "2026-03-02",
        "--limit", "7", "--max-redrives", "1"])
    selection = redrive.selection_from_args(args)
    assert selection == redrive.Selection(
        "genai_image", "run-", ("check", "generate"), ("ai_unavailable",),
        datetime(2026, 3, 1, 10, tzinfo=timezone(timedelta(hours=2))), datetime(2026, 3, 2, tzinfo=UTC),
        limit=7, max_redrives=1)
    assert selection.params() == {
        "pipeline": "genai_image", "run": "run-", "stages": ["check", "generate"],
        "reasons": ["ai_unavailable"], "since": selection.since, "until": selection.until,
        "limit": 7, "max_redrives": 1}
    defaults = redrive.selection_from_args(redrive._parser().parse_args(["--pipeline", "genai_image"]))
    assert defaults == redrive.Selection("genai_image", "", (), (), None, None, 100, 3)


@pytest.mark.parametrize(("argv", "message"), [
    (["--limit", "0"], "limit must be at least 1"),
    (["--max-redrives", "-1"], "max_redrives must not be negative"),
    (["--since", "yesterday"], "Invalid isoformat string"),
    (["--since", "2026-03-02", "--until", "2026-03-01"], "must be before until"),
    (["--stage", "render"], "genai_image has no stage render; its stages: intake, check, generate"),
])
def test_the_command_line_refuses_a_bad_selection_before_it_connects(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        redrive.main(["--pipeline", "genai_image", "--database-url", "postgresql://nowhere.invalid/x",
                      "--bootstrap-servers", "nowhere.invalid:9092", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_selection_names_only_stages_of_its_pipeline() -> None:
    redrive.Selection("text_moderation", stages=("summarize", "classify")).check(load("text_moderation"))
    with pytest.raises(ValueError, match="text_moderation has no stage generate"):
        redrive.Selection("text_moderation", stages=("generate",)).check(load("text_moderation"))


@pytest.mark.parametrize(("dag_run", "expected"), [
    (SimpleNamespace(triggering_user_name="alice"), "alice"),  # triggered through the REST API
    (SimpleNamespace(triggering_user_name=None), "scheduler"),
    (None, "scheduler"),
])
def test_a_run_is_recorded_as_asked_by_its_triggering_user(dag_run: object, expected: str) -> None:
    assert requested_by({"dag_run": dag_run}) == expected


def test_the_operator_refuses_a_bad_form_without_a_retry() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    operator = RedriveOperator(task_id="redrive", pipeline="genai_image", stages='["check"]',
                               since="2026-03-02", until="2026-03-01")
    with pytest.raises(AirflowFailException, match="must be before until"):
        operator.execute({"dag_run": None, "run_id": "manual__1"})
