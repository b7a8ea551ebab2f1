"""One stage's AI call: claimed first, tries on record, poison only after the request's own tries.

The HTTP layer is scripted (each try's outcome is given), the retry loop is the real
`AIClient`'s, and storage is an in-memory fake of the calls a stage makes.
"""

from __future__ import annotations

import uuid
from collections import deque
from typing import Any

import psycopg2
import pytest

from consumers import events, stages
from consumers.ai_client import AIClient, AIUnavailable, Endpoint, RetryPolicy
from consumers.failures import POISON, TRANSIENT, AIBusy, ClaimHeld, classify
from consumers.storage import Claim, Origin

ORIGIN = Origin("generate-0", "p.generate", 0, 7)
ANSWERS = {"ok": (200, {"result_url": "https://cdn/x.png"}), "http_5xx": (500, {}),
           "http_429": (429, {}), "timeout": (None, {}), "http_4xx": (400, {})}


class ScriptedClient(AIClient):
    """The real retry loop over scripted try outcomes; counts the requests it 'sent'."""

    def __init__(self, *outcomes: str, max_attempts: int = 4) -> None:
        super().__init__(Endpoint("http://ai/v1/generate"),
                         RetryPolicy(max_attempts=max_attempts, backoff_base_s=0.0, backoff_max_s=0.0))
        self.outcomes = deque(outcomes)
        self.sent = 0

    def _post(self, payload: dict[str, Any]) -> tuple[int | None, dict, str, float | None]:
        self.sent += 1
        outcome = self.outcomes.popleft()
        status, body = ANSWERS[outcome]
        return status, body, outcome, None


class FakeStorage:
    def __init__(self, claim: Claim | None = None, fail_result_writes: int = 0) -> None:
        self.claim_answer = claim or Claim(ours=True)
        self.fail_result_writes = fail_result_writes
        self.attempts: dict[int, list[Any]] = {}
        self.results: list[str] = []
        self.skips = 0

    def claim(self, request_id: str, stage: str, owner: str, lease_s: float) -> Claim:
        return self.claim_answer

    def start_attempt(self, *args: Any) -> int:
        row_id = len(self.attempts) + 1
        self.attempts[row_id] = ["started"]
        return row_id

    def end_attempts(self, ended: list[tuple[int, float, str, int | None]]) -> None:
        for row_id, _, outcome, _ in ended:
            self.attempts[row_id] = [outcome]

    def record_result(self, stage: str, event: dict, detail: str, origin: Origin) -> bool:
        if self.fail_result_writes:
            self.fail_result_writes -= 1
            raise psycopg2.OperationalError("server closed the connection unexpectedly")
        self.results.append(detail)
        return True

    def record_skip(self, *args: Any) -> None:
        self.skips += 1

    def mark_notified(self, request_id: str) -> None:
        pass

    def outcomes(self) -> list[str]:
        return [row[0] for row in self.attempts.values()]


class Sent:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def __call__(self, topic: str, event: dict) -> None:
        self.events.append((topic, event))


def context(storage: FakeStorage, client: ScriptedClient) -> stages.StageContext:
    ctx = stages.StageContext(stage="generate", topics=events.Topics("p"), storage=storage,  # type: ignore[arg-type]
                              producer=None, generate_ai=client)  # type: ignore[arg-type]
    ctx.send = Sent()  # type: ignore[method-assign]
    return ctx


EVENT = events.style_event("run", str(uuid.uuid4()), "minimal", "a poster")


def handle(ctx: stages.StageContext, state: stages.RecordState) -> Exception | None:
    try:
        stages.handle(ctx, EVENT, ORIGIN, state)
    except Exception as exc:  # noqa: BLE001 - the test classifies it
        return exc
    return None


def test_429s_do_not_use_up_the_requests_tries() -> None:
    storage, client = FakeStorage(), ScriptedClient("http_429", "http_429", "http_429", "http_5xx")
    state = stages.RecordState()
    failure = handle(context(storage, client), state)
    # 4 tries, only one of them the request's own failure: the record waits, not dead-lettered.
    assert isinstance(failure, AIBusy) and classify(failure).kind == TRANSIENT
    assert storage.outcomes() == ["http_429", "http_429", "http_429", "http_5xx"]  # all on record

    client.outcomes.extend(["http_5xx", "timeout", "http_5xx", "ok"])
    assert handle(context(storage, client), state) is None  # the retry of the record completes
    assert storage.results == ["https://cdn/x.png"]
    assert client.sent == 8


def test_the_requests_own_failures_dead_letter_it_after_its_tries() -> None:
    storage, client = FakeStorage(), ScriptedClient("http_429", "http_5xx", "timeout", "http_5xx")
    state = stages.RecordState()
    assert isinstance(handle(context(storage, client), state), AIBusy)  # 3 own failures of 4
    client.outcomes.extend(["http_5xx", "http_429", "http_429", "http_429"])
    failure = handle(context(storage, client), state)  # the 4th own failure
    assert isinstance(failure, AIUnavailable) and classify(failure).kind == POISON
    sent = client.sent
    assert isinstance(handle(context(storage, client), state), AIUnavailable)  # decided: no new call
    assert client.sent == sent == 8
    assert storage.results == []


def test_a_final_4xx_is_poison_at_once() -> None:
    storage, client = FakeStorage(), ScriptedClient("http_4xx")
    failure = handle(context(storage, client), stages.RecordState())
    assert isinstance(failure, AIUnavailable) and classify(failure).kind == POISON
    assert client.sent == 1


def test_an_answer_received_before_a_database_outage_is_stored_without_calling_again() -> None:
    storage, client = FakeStorage(fail_result_writes=2), ScriptedClient("ok")
    ctx, state = context(storage, client), stages.RecordState()
    for _ in range(2):
        failure = handle(ctx, state)
        assert classify(failure).kind == TRANSIENT  # type: ignore[arg-type]
    assert handle(ctx, state) is None
    assert client.sent == 1
    assert storage.results == ["https://cdn/x.png"]
    assert [topic for topic, _ in ctx.send.events] == ["p.notify"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("claim", "expected"),
                         [(Claim(ours=False), ClaimHeld), (Claim(done="https://cdn/y"), None)])
def test_a_claimed_or_finished_request_is_not_called(claim: Claim, expected: type | None) -> None:
    storage, client = FakeStorage(claim=claim), ScriptedClient()
    failure = handle(context(storage, client), stages.RecordState())
    assert client.sent == 0
    if expected is None:
        assert failure is None and storage.skips == 1  # the recorded result is re-sent downstream
    else:
        assert isinstance(failure, expected) and classify(failure).kind == TRANSIENT
