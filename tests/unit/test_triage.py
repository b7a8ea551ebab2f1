"""Dead-letter triage without the stack: the counting, the alarm threshold, the redrive selection
and the circuit rule (plugins/pipeline_ops/triage.py), and the watcher's one event per burst
(plugins/pipeline_ops/dead_letter_watch.py). Expectations are worked out by hand."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from airflow.sdk.exceptions import AirflowFailException

from consumers.config.events import Topics
from consumers.config.pipeline_spec import load
from pipeline_ops import dead_letter_watch as watch
from pipeline_ops.triage import Group, alarms, circuit_closed, counts, raise_alarms, redrive_conf, redrives

T0 = datetime(2026, 5, 4, 10, 0, 0, tzinfo=UTC)
T1 = datetime(2026, 5, 4, 10, 0, 7, tzinfo=UTC)

GROUPS = [
    # two runs of genai_image dead-lettering at the same stage for the same reason
    Group("genai_image", "run-a", "generate", "ai_unavailable", 40, T1),
    Group("genai_image", "run-b", "generate", "ai_unavailable", 35, T0),
    Group("genai_image", "run-a", "intake", "malformed_json", 3, T0),
    Group("text_moderation", "run-c", "summarize", "work_failed", 2, T0),
    Group("text_moderation", "run-c", "check", "ai_bad_answer", 1, T1),
]


def test_counts_add_runs_up_by_pipeline_stage_and_reason() -> None:
    assert counts(GROUPS) == [
        {"pipeline": "genai_image", "stage": "generate", "reason": "ai_unavailable", "letters": 75},
        {"pipeline": "genai_image", "stage": "intake", "reason": "malformed_json", "letters": 3},
        {"pipeline": "text_moderation", "stage": "check", "reason": "ai_bad_answer", "letters": 1},
        {"pipeline": "text_moderation", "stage": "summarize", "reason": "work_failed", "letters": 2},
    ]


def test_counts_of_nothing_are_empty() -> None:
    assert counts([]) == []
    assert alarms([], 0) == {}


@pytest.mark.parametrize(("threshold", "expected"), [
    (77, {"genai_image": 78}),          # 75 + 3 is past 77
    (78, {}),                           # 78 is not past 78
    (2, {"genai_image": 78, "text_moderation": 3}),
    (3, {"genai_image": 78}),
])
def test_the_alarm_is_per_pipeline_past_the_threshold(threshold: int, expected: dict[str, int]) -> None:
    assert alarms(counts(GROUPS), threshold) == expected


def test_only_ai_unavailable_letters_are_redriven_one_entry_per_run_and_stage() -> None:
    assert redrives(GROUPS) == [
        {"pipeline": "genai_image", "run": "run-a", "stage": "generate", "letters": 40,
         "since": "2026-05-04T10:00:07+00:00"},
        {"pipeline": "genai_image", "run": "run-b", "stage": "generate", "letters": 35,
         "since": "2026-05-04T10:00:00+00:00"},
    ]


def test_a_redrive_selects_that_run_stage_and_reason_from_the_earliest_letter_on() -> None:
    assert redrive_conf(redrives(GROUPS)[0]) == {
        "pipeline": "genai_image", "run": "run-a", "stages": ["generate"], "reasons": ["ai_unavailable"],
        "since": "2026-05-04T10:00:07+00:00", "until": "", "limit": 40}


@pytest.mark.parametrize(("states", "closed"), [
    ([], True),                      # the circuit never opened
    (["closed"], True),
    (["open"], False),
    (["half_open"], False),
    (["closed", "open"], False),     # one of the stage's endpoints still failing
])
def test_a_stage_goes_back_once_every_endpoint_circuit_is_closed(states: list[str], closed: bool) -> None:
    assert circuit_closed(states) is closed


def test_an_alarm_fails_the_task_naming_the_pipelines(caplog: pytest.LogCaptureFixture) -> None:
    summary = {"letters": 81, "threshold": 77, "alarms": {"genai_image": 78}}
    with pytest.raises(AirflowFailException, match="genai_image: 78"):
        raise_alarms(summary)
    assert [r.levelname for r in caplog.records] == ["ERROR"]


def test_no_alarm_below_the_threshold(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    assert raise_alarms({"letters": 81, "threshold": 100, "alarms": {}}) is None
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "81 new dead letter(s), no pipeline past the threshold of 100")]


def test_a_window_opens_on_the_first_record_and_again_window_s_after_it() -> None:
    window = watch.BurstWindow(10.0)
    opened = [now for now in (100.0, 100.2, 109.9, 110.0, 110.1, 125.0, 134.99) if window.opens(now)]
    assert opened == [100.0, 110.0, 125.0]


async def _records(count: int) -> AsyncIterator[bytes]:
    for i in range(count):
        yield f"dead letter {i}".encode()


def _events(trigger: watch.DeadLetterBurstTrigger, records: AsyncIterator[bytes]) -> list:
    async def collect() -> list:
        return [event async for event in trigger.filter_shared_stream(records)]
    return asyncio.run(collect())


def test_a_burst_of_fifty_records_fires_one_event() -> None:
    trigger = watch.DeadLetterBurstTrigger(topics=["^x\\.dlq$"], window_s=30.0)
    events = _events(trigger, _records(50))
    assert [e.payload for e in events] == [{"window_s": 30.0}]


def test_records_further_apart_than_the_window_fire_one_event_each(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 0.5, 11.0, 11.5, 30.0])
    monkeypatch.setattr(watch, "monotonic", lambda: next(clock))
    trigger = watch.DeadLetterBurstTrigger(topics=["^x\\.dlq$"], window_s=10.0)
    assert len(_events(trigger, _records(5))) == 3  # at 0, 11 and 30


def test_the_trigger_serializes_to_itself() -> None:
    trigger = watch.DeadLetterBurstTrigger(topics=["^b\\.dlq$", "^a\\.dlq$"], window_s=4.0)
    classpath, kwargs = trigger.serialize()
    assert classpath == "pipeline_ops.dead_letter_watch.DeadLetterBurstTrigger"
    assert kwargs == {"topics": ["^a\\.dlq$", "^b\\.dlq$"], "kafka_config_id": "kafka_dead_letter_watch",
                      "poll_timeout": 1.0, "window_s": 4.0}
    again = watch.DeadLetterBurstTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert again.shared_stream_key() == trigger.shared_stream_key()


def test_the_default_pattern_matches_every_runs_dead_letter_topic_and_nothing_else(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(watch.TOPICS_ENV, raising=False)
    pattern = watch.watched_topics()
    assert pattern.startswith("^")  # librdkafka subscribes to a pattern only when it starts with ^
    topics = Topics("bench-3f2a.run-7", load("genai_image"))
    matched = [t for t in topics.all() if re.search(pattern, t)]
    assert matched == [topics.dead_letter] == ["bench-3f2a.run-7.dlq"]
    assert not re.search(pattern, "bench-3f2a.run-7.dlq-archive")


@pytest.mark.parametrize(("subscription", "topic", "matched"), [
    (r"^.+\.dlq$", "run-1.dlq", True),
    (r"^.+\.dlq$", "run-1.intake", False),
    (r"^team-a\..*\.dlq$", "team-b.run-1.dlq", False),
    ("run-1.dlq", "run-1.dlq", True),      # a name, not a pattern: only itself
    ("run-1.dlq", "run-10.dlq", False),
])
def test_a_subscription_entry_is_a_pattern_only_when_it_starts_with_a_caret(subscription: str, topic: str,
                                                                            matched: bool) -> None:
    assert watch.matches(subscription, topic) is matched


class _Metadata:
    def __init__(self, topics: list[str]) -> None:
        self.topics = dict.fromkeys(topics)


class _Consumer:
    """What the watcher asks before it subscribes: the cluster's topics, three times."""

    def __init__(self) -> None:
        self.answers = [["run-1.intake"], ["run-1.intake", "other.dlq"], ["run-1.intake", "run-1.dlq"]]
        self.asked = 0
        self.closed = False

    def list_topics(self, timeout: float) -> _Metadata:
        self.asked += 1
        return _Metadata(self.answers[self.asked - 1])

    def close(self) -> None:
        self.closed = True


def test_the_watcher_opens_its_stream_once_a_topic_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _Consumer()
    monkeypatch.setattr(watch, "KafkaConsumerHook", lambda **_: type("Hook", (), {"get_conn": consumer}))
    monkeypatch.setattr(watch, "TOPIC_CHECK_S", 0.0)
    trigger = watch.DeadLetterBurstTrigger(topics=["^run-1\\.dlq$"])
    producer = type(trigger).create_shared_stream_producer(trigger.serialize()[1])
    assert isinstance(producer, watch.WatchProducer)
    asyncio.run(producer._until_a_topic_matches())
    assert (consumer.asked, consumer.closed) == (3, True)


def test_a_deployment_narrows_the_pattern(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(watch.TOPICS_ENV, r"^team-a\..*\.dlq$")
    assert watch.trigger().topics == [r"^team-a\..*\.dlq$"]
