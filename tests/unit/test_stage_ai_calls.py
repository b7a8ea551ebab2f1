"""One stage's AI call: claimed first, tries on record, poison only after the request's own tries
(counted across handlings), waiting while the endpoint is down for everyone.

The HTTP layer is scripted (each try's outcome is given), the retry loop is the real
`AIClient`'s, and storage is an in-memory fake of the calls a stage makes. Every AI stage of
every shipped pipeline is run through each case.
"""

from __future__ import annotations

import io
import itertools
import json
from collections import deque
from typing import Any

import psycopg2
import pytest
import urllib3

from consumers.ai.admission import CONCURRENCY
from consumers.ai.circuit import Circuit
from consumers.ai.client import (
    AIBadAnswer,
    AIClient,
    AIUnavailable,
    AIWaiting,
    Endpoint,
    EndpointDown,
    RetryPolicy,
)
from consumers.ai.reply import Reply
from consumers.config import events, http_work, pipeline_spec
from consumers.runtime import stages
from consumers.runtime.failures import POISON, TRANSIENT, ClaimHeld, Verdict, classify
from consumers.runtime.outbox import Outgoing
from consumers.runtime.storage import CallClaim, Claim, Ended, Key, Origin, Status
from tests import bad_input

AI_STAGES = [(spec, stage) for spec, stage in bad_input.cases() if stage in spec.ai_stages]


@pytest.fixture(params=AI_STAGES, ids=[f"{spec.name}-{stage}" for spec, stage in AI_STAGES])
def ai_stage(request: pytest.FixtureRequest) -> tuple[pipeline_spec.PipelineSpec, str]:
    return request.param


def answer(spec: pipeline_spec.PipelineSpec, stage: str) -> dict[str, Any]:
    """A successful body: each field the stage keeps (`<name>-answer` at its path), plus one it
    does not."""
    body: dict[str, Any] = {"unkept": "x"}
    for name, path in spec.stages[stage].work.kept.items():
        put(body, http_work.steps(path), f"{name}-answer")
    return body


def put(body: Any, steps: list[str | int], value: Any) -> None:
    """Set `value` at `steps` in `body`, making the dicts and lists on the way."""
    for step, following in itertools.pairwise(steps):
        if isinstance(step, int):
            body.extend([None] * (step + 1 - len(body)))
            if body[step] is None:
                body[step] = [] if isinstance(following, int) else {}
        else:
            body.setdefault(step, [] if isinstance(following, int) else {})
        body = body[step]
    if isinstance(steps[-1], int):
        body.extend([None] * (steps[-1] + 1 - len(body)))
    body[steps[-1]] = value


def kept(spec: pipeline_spec.PipelineSpec, stage: str) -> dict[str, str]:
    return {name: f"{name}-answer" for name in spec.stages[stage].work.kept}


STATUS = {"ok": 200, "http_5xx": 500, "http_429": 429, "timeout": None, "http_4xx": 400}


class ScriptedClient(AIClient):
    """The real retry loop over scripted try outcomes; counts the requests it 'sent'."""

    def __init__(self, body: dict[str, Any], *outcomes: str, max_attempts: int = 4,
                 circuit: Circuit | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(Endpoint("http://ai/v1/work"),
                         RetryPolicy(max_attempts=max_attempts, backoff_base_s=0.0, backoff_max_s=0.0),
                         circuit=circuit)
        self.body, self.headers = body, headers or {}
        self.outcomes = deque(outcomes)
        self.sent = 0
        self.payloads: list[dict[str, Any]] = []

    def _post(self, payload: dict[str, Any], timeout_s: float) -> Reply:
        self.sent += 1
        self.payloads.append(payload)
        outcome = self.outcomes.popleft()
        return Reply(STATUS[outcome], self.body if outcome == "ok" else {}, outcome,
                     refusal=CONCURRENCY if outcome == "http_429" else None,
                     headers=self.headers if outcome == "ok" else {})


class FakeStorage:
    def __init__(self, claim: Claim | None = None, fail_result_writes: int = 0,
                 fail_attempt_writes: int = 0) -> None:
        self.claim_answer = claim  # None: the claim is won
        self.fail_result_writes = fail_result_writes
        self.fail_attempt_writes = fail_attempt_writes
        self.attempts: dict[int, list[Any]] = {}
        self.endings: dict[int, Ended] = {}
        self.results: list[dict | None] = []
        self.statuses: list[str | None] = []
        self.claims = 0

    def take(self, key: Key, produced_at: float, fields: dict, status: Status | None,
             call: CallClaim | None = None) -> tuple[dict, Claim | None]:
        """A won claim writes the first try's row, as the real statement does."""
        if call is None:
            return fields, None
        self.claims += 1
        if self.claim_answer is not None:
            return fields, self.claim_answer
        row_id = len(self.attempts) + 1
        self.attempts[row_id] = ["queued"]
        return fields, Claim(first_attempt=row_id)

    def start_attempt(self, *args: Any, row: int | None = None) -> int:
        """The try is sent: the first try's row (the claim's) or a row of its own."""
        row_id = row if row is not None else len(self.attempts) + 1
        self.attempts[row_id] = ["started"]
        return row_id

    def end_attempts(self, ended: list[Ended]) -> None:
        if self.fail_attempt_writes:
            self.fail_attempt_writes -= 1
            raise psycopg2.OperationalError("server closed the connection unexpectedly")
        for ending in ended:
            self.attempts[ending.row] = [ending.outcome, ending.own]
            self.endings[ending.row] = ending

    def record_result(self, key: Key, stage: str, result: dict | None, origin: Origin,
                      status: Status | None, entry: bool, ended: list[Ended]) -> bool:
        """One transaction: a failure writes neither the result nor its tries' endings."""
        if self.fail_result_writes:
            self.fail_result_writes -= 1
            raise psycopg2.OperationalError("server closed the connection unexpectedly")
        self.end_attempts(ended)
        self.results.append(result)
        self.statuses.append(status.name if status else None)
        return True

    def mark_notified(self, key: Key) -> None:
        pass

    def outcomes(self) -> list[str]:
        return [row[0] for row in self.attempts.values()]


class Sent:
    """An outbox that keeps what each record handed over: (topic, event) pairs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def deliver(self, origin: Origin, outgoing: list[Outgoing], settles: Key | None) -> None:
        self.events.extend((o.topic.removeprefix("p."), json.loads(o.value)) for o in outgoing)


def context(spec: pipeline_spec.PipelineSpec, stage: str, storage: FakeStorage,
            client: ScriptedClient) -> stages.StageContext:
    return stages.StageContext(stage=stage, topics=events.Topics("p", spec), storage=storage,  # type: ignore[arg-type]
                               outbox=Sent(), ai=client)


def handle(ctx: stages.StageContext, state: stages.RecordState,
           event: dict[str, Any] | None = None) -> Exception | None:
    spec = ctx.topics.spec
    origin = Origin(f"{ctx.stage}-0", ctx.topics.source_of(ctx.stage), 0, 7)
    try:
        stages.handle(ctx, event or bad_input.valid_event(spec, ctx.stage), origin, state)
    except Exception as exc:  # noqa: BLE001 - the test classifies it
        return exc
    return None


# Where each AI stage's outcome goes with the scripted answer ("<field>-answer" for every kept
# field: no stage's `when` matches it), read off the specs by hand.
ROUTED = {("genai_image", "check"): ["notify"], ("genai_image", "generate"): ["notify"],
          ("text_moderation", "moderate"): ["replies"], ("text_moderation", "summarize"): ["answers"],
          ("text_moderation", "classify"): ["answers"], ("support_tickets", "triage"): ["drafts"],
          ("support_tickets", "draft"): ["replies"]}


def test_every_ai_stage_has_its_expected_routes() -> None:
    assert {(spec.name, stage) for spec, stage in AI_STAGES} == set(ROUTED)


def test_429s_do_not_use_up_the_requests_tries(ai_stage: tuple) -> None:
    spec, stage = ai_stage
    storage = FakeStorage()
    client = ScriptedClient(answer(spec, stage), "http_429", "http_429", "http_429", "http_5xx")
    state = stages.RecordState()
    failure = handle(context(spec, stage, storage, client), state)
    # 4 tries, only one of them the request's own failure: the record waits, not dead-lettered.
    assert isinstance(failure, AIWaiting) and classify(failure).kind == TRANSIENT
    assert storage.outcomes() == ["http_429", "http_429", "http_429", "http_5xx"]  # all on record

    client.outcomes.extend(["http_5xx", "timeout", "ok"])
    assert handle(context(spec, stage, storage, client), state) is None  # the retry completes
    assert storage.results == [kept(spec, stage)]  # the kept fields only
    assert client.sent == 7
    # every try completed on record, the last one with the result it got
    assert storage.outcomes() == ["http_429", "http_429", "http_429", "http_5xx",
                                  "http_5xx", "timeout", "ok"]


def test_each_tries_tokens_and_reported_cost_reach_its_attempt_row(ai_stage: tuple) -> None:
    spec, stage = ai_stage
    storage = FakeStorage()
    body = {**answer(spec, stage), "usage": {"prompt_tokens": 31, "completion_tokens": 9}}
    client = ScriptedClient(body, "http_429", "ok", headers={"x-litellm-response-cost": "0.000123"})
    assert handle(context(spec, stage, storage, client), stages.RecordState()) is None
    rows = [(e.outcome, e.tokens_input, e.tokens_output, e.reported_cost) for e in storage.endings.values()]
    assert rows == [("http_429", None, None, None), ("ok", 31, 9, 0.000123)]


def test_the_request_fields_come_from_the_event(ai_stage: tuple) -> None:
    spec, stage = ai_stage
    client = ScriptedClient(answer(spec, stage), "ok")
    assert handle(context(spec, stage, FakeStorage(), client), stages.RecordState()) is None
    event = bad_input.valid_event(spec, stage)
    work = spec.stages[stage].work
    if work.protocol == "openai_chat":  # the request's key as the end user, the event's text in a message
        assert client.payloads[0]["user"] == bad_input.REQUEST_ID
        assert event["subject"] in client.payloads[0]["messages"][-1]["content"]
        return
    request = work.request
    assert client.payloads == [{name: event[field] for name, field in request.items()}]
    assert client.payloads[0][next(iter(request))] == bad_input.REQUEST_ID  # each spec sends its key first


def test_the_requests_own_failures_dead_letter_it_after_its_tries(ai_stage: tuple) -> None:
    spec, stage = ai_stage
    storage = FakeStorage()
    client = ScriptedClient(answer(spec, stage), "http_429", "http_5xx", "timeout", "http_5xx")
    state = stages.RecordState()
    assert isinstance(handle(context(spec, stage, storage, client), state), AIWaiting)  # 3 own of 4
    client.outcomes.extend(["http_5xx", "http_429", "http_429", "http_429"])
    failure = handle(context(spec, stage, storage, client), state)  # the 4th own failure ends it
    assert isinstance(failure, AIUnavailable) and classify(failure).kind == POISON
    assert isinstance(handle(context(spec, stage, storage, client), state), AIUnavailable)  # no new call
    assert client.sent == 5  # 1 x 429 + 4 own failures: the second call had one try left, not four
    assert storage.outcomes() == ["http_429", "http_5xx", "timeout", "http_5xx", "http_5xx"]
    assert [row[1] for row in storage.attempts.values()] == [False, True, True, True, True]
    assert storage.results == []


def test_the_own_failures_of_earlier_handlings_count(ai_stage: tuple) -> None:
    # Another member (or this one before a restart) had 3 of the request's 4 own failures.
    spec, stage = ai_stage
    storage = FakeStorage()
    storage.claim_answer = Claim(first_attempt=storage.start_attempt(), own_failures=3)
    client = ScriptedClient(answer(spec, stage), "timeout", "ok")
    failure = handle(context(spec, stage, storage, client), stages.RecordState())
    assert isinstance(failure, AIUnavailable) and client.sent == 1


def test_an_endpoint_down_for_everyone_holds_its_records_instead_of_dead_lettering_them(
        ai_stage: tuple) -> None:
    # Three requests fail at once with nothing served: the endpoint is down, not the requests.
    spec, stage = ai_stage
    circuit, storage = Circuit(), FakeStorage()
    client = ScriptedClient(answer(spec, stage), *["http_5xx"] * 3, max_attempts=1, circuit=circuit)
    ctx, event = context(spec, stage, storage, client), bad_input.valid_event(spec, stage)
    key = spec.key
    failures = [handle(ctx, stages.RecordState(), {**event, key: f"r{i}"}) for i in range(3)]
    # r0 and r1 used their one try and the endpoint serves no one: they wait; r2 opened the circuit.
    assert [type(f) for f in failures] == [AIWaiting, AIWaiting, AIWaiting]
    assert [row[1] for row in storage.attempts.values()] == [True, True, False]
    assert circuit.state == "open"
    claims = storage.claims
    waiting = handle(ctx, stages.RecordState(), {**event, key: "r3"})
    assert isinstance(waiting, EndpointDown) and classify(waiting).kind == TRANSIENT
    assert storage.claims == claims and client.sent == 3  # held back before its claim: nothing written


def test_an_answer_the_endpoint_gives_others_dead_letters_a_request_that_keeps_failing(
        ai_stage: tuple) -> None:
    spec, stage = ai_stage
    circuit, storage = Circuit(), FakeStorage()
    client = ScriptedClient(answer(spec, stage), "ok", "http_5xx", "http_5xx", max_attempts=2,
                            circuit=circuit)
    ctx, event = context(spec, stage, storage, client), bad_input.valid_event(spec, stage)
    assert handle(ctx, stages.RecordState(), {**event, spec.key: "served"}) is None
    failure = handle(ctx, stages.RecordState(), {**event, spec.key: "refused"})
    assert isinstance(failure, AIUnavailable) and classify(failure).reason == "ai_unavailable"


def test_an_answer_without_a_kept_field_is_the_requests_fault(ai_stage: tuple) -> None:
    spec, stage = ai_stage
    client = ScriptedClient({"unkept": "x"}, "ok")
    failure = handle(context(spec, stage, FakeStorage(), client), stages.RecordState())
    assert isinstance(failure, AIBadAnswer) and classify(failure) == Verdict(POISON, "ai_bad_answer")


def answered(status: int, data: bytes) -> urllib3.HTTPResponse:
    """What urllib3 gives back: a status and the raw body, still to be read."""
    return urllib3.HTTPResponse(body=io.BytesIO(data), status=status, preload_content=False)


def test_a_2xx_whose_body_is_not_json_is_a_bad_answer_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    client = AIClient(Endpoint("http://ai/v1/work"), RetryPolicy(max_attempts=4))
    sent: list[str] = []
    monkeypatch.setattr(client._pool, "request",
                        lambda *a, **k: sent.append("try") or answered(200, b"<html>gateway</html>"))
    with pytest.raises(AIBadAnswer) as failure:
        client.call({"request_id": "r"})
    assert classify(failure.value) == Verdict(POISON, "ai_bad_answer") and sent == ["try"]


def test_a_final_4xx_is_poison_at_once(ai_stage: tuple) -> None:
    spec, stage = ai_stage
    client = ScriptedClient(answer(spec, stage), "http_4xx")
    failure = handle(context(spec, stage, FakeStorage(), client), stages.RecordState())
    assert isinstance(failure, AIUnavailable) and classify(failure).kind == POISON
    assert client.sent == 1


@pytest.mark.parametrize("failing", ["fail_result_writes", "fail_attempt_writes"])
def test_an_answer_received_before_a_database_outage_is_stored_without_calling_again(
        ai_stage: tuple, failing: str) -> None:
    spec, stage = ai_stage
    storage, client = FakeStorage(**{failing: 2}), ScriptedClient(answer(spec, stage), "ok")
    ctx, state = context(spec, stage, storage, client), stages.RecordState()
    for _ in range(2):
        failure = handle(ctx, state)
        assert classify(failure).kind == TRANSIENT  # type: ignore[arg-type]
    assert handle(ctx, state) is None
    assert client.sent == 1 and storage.claims == 1  # the retries neither claim nor call again
    assert len(storage.results) == 1
    assert [topic for topic, _ in ctx.outbox.events] == ROUTED[spec.name, stage]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("claim", "expected"),
                         [(Claim(), ClaimHeld), (Claim(done={"recorded": "before"}), None)])
def test_a_claimed_or_finished_request_is_not_called(ai_stage: tuple, claim: Claim,
                                                     expected: type | None) -> None:
    spec, stage = ai_stage
    storage, client = FakeStorage(claim=claim), ScriptedClient(answer(spec, stage))
    ctx = context(spec, stage, storage, client)
    failure = handle(ctx, stages.RecordState())
    assert client.sent == 0
    if expected is None:
        assert failure is None and storage.claims == 1
        assert storage.results == [{"recorded": "before"}]
        assert [topic for topic, _ in ctx.outbox.events] == ROUTED[spec.name, stage]  # re-sent downstream
    else:
        assert isinstance(failure, expected) and classify(failure).kind == TRANSIENT
