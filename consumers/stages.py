"""What each stage does with one valid event.

intake   : write the request row, ask the user (via the bot topic) to pick a style
check    : call the checking AI, store the verdict, pass approved requests to `generate`,
           tell the user about rejected ones
generate : call the generative AI, store the result link, send it to the user

At most one AI call per (request, stage): before calling, the stage claims the pair in
PostgreSQL (`Storage.claim`), so a second copy of the same request waits for the first one's
result instead of calling too, and a member that died mid-call is taken over once its lease
expires. Every try is written before it is sent and completed after, so an interrupted call is
still counted. A stage whose result is already recorded does not call again but re-sends its
downstream event, which is idempotent downstream: an event lost between the two writes is
therefore never lost.

Failures raise; `consumers.failures` says which are the record's fault (dead-lettered) and
which are a dependency's (retried). What one record's handling achieved is kept in its
`RecordState` across those retries, so a retry after the database came back stores the AI
answer already received rather than calling again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from consumers import events
from consumers.ai_client import REQUEST_FAILURES, AIClient, AIUnavailable, Try
from consumers.failures import AIBusy, ClaimHeld
from consumers.producer import KeyedProducer
from consumers.storage import Origin, Storage

DELIVERY_TIMEOUT_S = 30.0


@dataclass
class StageContext:
    """Everything a stage handler needs; shared by the members of one fleet."""

    stage: str
    topics: events.Topics
    storage: Storage
    producer: KeyedProducer
    check_ai: AIClient | None = None
    generate_ai: AIClient | None = None
    claim_lease_s: float = 30.0  # longer than one try plus the backoff before the next

    def send(self, topic: str, event: dict[str, Any]) -> None:
        """Send downstream and wait for the acknowledgement: a record only completes after it."""
        self.producer.send(topic, event).result(DELIVERY_TIMEOUT_S)


@dataclass
class RecordState:
    """What handling one record has achieved so far, kept across its retries."""

    owner: str = field(default_factory=lambda: uuid.uuid4().hex)  # this handling's claim owner
    result: str | None = None  # the AI's answer, once received
    failure: AIUnavailable | None = None  # the AI's final failure, once known
    tries: list[Try] = field(default_factory=list)
    unwritten: list[tuple[int, float, str, int | None]] = field(default_factory=list)
    intake_first: bool = False
    dead_letter_sent: bool = False
    skipped_duplicate: bool = False


def handle(ctx: StageContext, event: dict[str, Any], origin: Origin, state: RecordState) -> None:
    """Run the stage's work for one validated event."""
    {"intake": _intake, "check": _check, "generate": _generate}[ctx.stage](ctx, event, origin, state)


def _intake(ctx: StageContext, event: dict[str, Any], origin: Origin, state: RecordState) -> None:
    state.intake_first = ctx.storage.record_intake(event, origin) or state.intake_first
    if state.intake_first:
        ctx.send(ctx.topics.notify, events.notification(event["request_id"], event["run_id"],
                                                        "choose_style", user_id=event["user_id"]))


@dataclass
class _AttemptLog:
    """Writes each try's row before it is sent (renewing the claim) and keeps its ending."""

    ctx: StageContext
    stage: str
    event: dict[str, Any]
    origin: Origin
    state: RecordState
    _ids: dict[int, int] = field(default_factory=dict)

    def started(self, attempt: int, at: float) -> None:
        self._ids[attempt] = self.ctx.storage.start_attempt(
            self.event["run_id"], self.event["request_id"], self.stage, self.origin,
            self.state.owner, self.ctx.claim_lease_s, attempt, at)

    def ended(self, attempt: Try) -> None:
        self.state.tries.append(attempt)
        self.state.unwritten.append((self._ids[attempt.attempt], attempt.ended, attempt.outcome,
                                     attempt.http_status))


def _ai_result(ctx: StageContext, client: AIClient | None, stage: str, answer_field: str,
               event: dict[str, Any], origin: Origin, state: RecordState) -> str:
    """The stage's AI answer: recorded already, received before a retry, or called for now."""
    if state.result is None and state.failure is None:
        claim = ctx.storage.claim(event["request_id"], stage, state.owner, ctx.claim_lease_s)
        if claim.done is not None:
            ctx.storage.record_skip(event["run_id"], event["request_id"], stage, origin)
            state.skipped_duplicate = True
            return claim.done
        if not claim.ours:
            raise ClaimHeld(f"{stage} of {event['request_id']} is being called by another member")
        if client is None:
            raise RuntimeError(f"stage {stage} has no AI endpoint configured")
        try:
            body = client.call({"request_id": event["request_id"], "style": event["style"],
                                "description": event["description"]},
                               _AttemptLog(ctx, stage, event, origin, state))
        except AIUnavailable as exc:
            own = sum(t.outcome in REQUEST_FAILURES for t in state.tries)
            if exc.final or own >= client.policy.max_attempts:
                state.failure = exc  # the request had its tries: its own fault
            ctx.storage.end_attempts(state.unwritten)
            state.unwritten.clear()
            if state.failure is None:
                raise AIBusy(f"{exc.reason}; {own} of {client.policy.max_attempts} tries were "
                             "the request's own failures") from exc
            raise
        if not isinstance(body.get(answer_field), str):
            state.failure = AIUnavailable(f"answer from {stage} without {answer_field!r}")
        else:
            state.result = body[answer_field]
    ctx.storage.end_attempts(state.unwritten)
    state.unwritten.clear()
    if state.failure is not None:
        raise state.failure
    ctx.storage.record_result(stage, event, state.result, origin)
    return state.result


def _check(ctx: StageContext, event: dict[str, Any], origin: Origin, state: RecordState) -> None:
    ctx.storage.record_style(event)
    verdict = _ai_result(ctx, ctx.check_ai, "check", "verdict", event, origin, state)
    if verdict == "approved":
        ctx.send(ctx.topics.generate, {**event})
    else:
        ctx.send(ctx.topics.notify, events.notification(event["request_id"], event["run_id"],
                                                        "rejected", verdict=verdict))
        ctx.storage.mark_notified(event["request_id"])


def _generate(ctx: StageContext, event: dict[str, Any], origin: Origin, state: RecordState) -> None:
    url = _ai_result(ctx, ctx.generate_ai, "generate", "result_url", event, origin, state)
    ctx.send(ctx.topics.notify, events.notification(event["request_id"], event["run_id"],
                                                    "result", url=url))
    ctx.storage.mark_notified(event["request_id"])
