"""What each stage does with one valid event.

intake   : write the request row, ask the user (via the bot topic) to pick a style
check    : call the checking AI, store the verdict, pass approved requests to `generate`,
           tell the user about rejected ones
generate : call the generative AI, store the result link, send it to the user

A stage whose result is already recorded does not call the AI again (re-consumption after a
rebalance costs a database read, not a GPU call) but re-sends its downstream event, which is
idempotent downstream: an event lost between the two writes is therefore never lost.
Failures raise: `InvalidEvent` and `AIUnavailable` are dead-lettered by the consumer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from consumers import events
from consumers.ai_client import AIClient, Try
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

    def send(self, topic: str, event: dict[str, Any]) -> None:
        """Send downstream and wait for the acknowledgement: a record only completes after it."""
        self.producer.send(topic, event).result(DELIVERY_TIMEOUT_S)


@dataclass
class Outcome:
    """What handling one event produced, for metrics and the attempts table."""

    tries: list[Try] = field(default_factory=list)
    skipped_duplicate: bool = False


def handle(ctx: StageContext, event: dict[str, Any], origin: Origin) -> Outcome:
    """Run the stage's work for one validated event."""
    return {"intake": _intake, "check": _check, "generate": _generate}[ctx.stage](ctx, event, origin)


def _intake(ctx: StageContext, event: dict[str, Any], origin: Origin) -> Outcome:
    if ctx.storage.record_intake(event, origin):
        ctx.send(ctx.topics.notify, events.notification(event["request_id"], event["run_id"],
                                                        "choose_style", user_id=event["user_id"]))
    return Outcome()


def _call(ctx: StageContext, client: AIClient | None, stage: str, event: dict[str, Any],
          origin: Origin, outcome: Outcome) -> dict[str, Any]:
    """One AI call with its tries recorded, whatever the result."""
    if client is None:
        raise RuntimeError(f"stage {stage} has no AI endpoint configured")
    try:
        return client.call({"request_id": event["request_id"], "style": event["style"],
                            "description": event["description"]},
                           observe=outcome.tries.append)
    finally:
        ctx.storage.record_attempts(event["run_id"], event["request_id"], stage, origin,
                                    [(t.attempt, t.started, t.ended, t.outcome, t.http_status)
                                     for t in outcome.tries])


def _skip(ctx: StageContext, stage: str, event: dict[str, Any], origin: Origin) -> None:
    """Record a re-consumed event whose result already exists (no AI call made)."""
    now = time.time()
    ctx.storage.record_attempts(event["run_id"], event["request_id"], stage, origin,
                                [(0, now, now, "skipped_done", None)])


def _check(ctx: StageContext, event: dict[str, Any], origin: Origin) -> Outcome:
    outcome = Outcome()
    ctx.storage.record_style(event)
    verdict = ctx.storage.stage_done(event["request_id"], "check")
    if verdict is not None:
        outcome.skipped_duplicate = True
        _skip(ctx, "check", event, origin)
    else:
        verdict = _call(ctx, ctx.check_ai, "check", event, origin, outcome)["verdict"]
        ctx.storage.record_result("check", event, verdict, origin)
    if verdict == "approved":
        ctx.send(ctx.topics.generate, {**event})
    else:
        ctx.send(ctx.topics.notify, events.notification(event["request_id"], event["run_id"],
                                                        "rejected", verdict=verdict))
        ctx.storage.mark_notified(event["request_id"])
    return outcome


def _generate(ctx: StageContext, event: dict[str, Any], origin: Origin) -> Outcome:
    outcome = Outcome()
    url = ctx.storage.stage_done(event["request_id"], "generate")
    if url is not None:
        outcome.skipped_duplicate = True
        _skip(ctx, "generate", event, origin)
    else:
        url = _call(ctx, ctx.generate_ai, "generate", event, origin, outcome)["result_url"]
        ctx.storage.record_result("generate", event, url, origin)
    ctx.send(ctx.topics.notify, events.notification(event["request_id"], event["run_id"],
                                                    "result", url=url))
    ctx.storage.mark_notified(event["request_id"])
    return outcome
