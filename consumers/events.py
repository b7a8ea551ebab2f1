"""The pipeline's events, their topics and their validation.

Each stage reads one topic. An event that cannot be processed (not JSON, a missing or
ill-typed field, too large, an unknown style) raises `InvalidEvent` with a reason that the
consumer puts on the dead-letter record, so the partition moves on and nothing is lost.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

MAX_EVENT_BYTES = 64 * 1024
STYLES = ("minimal", "corporate", "playful", "academic", "dark")
STAGES = ("intake", "check", "generate")


class InvalidEvent(ValueError):
    """An event the pipeline refuses; `reason` is a short machine-readable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Topics:
    """The topics of one pipeline, derived from a prefix so runs can be kept apart."""

    prefix: str

    @property
    def intake(self) -> str:
        return f"{self.prefix}.intake"

    @property
    def style(self) -> str:
        return f"{self.prefix}.style"

    @property
    def generate(self) -> str:
        return f"{self.prefix}.generate"

    @property
    def notify(self) -> str:
        return f"{self.prefix}.notify"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}.dlq"

    def source_of(self, stage: str) -> str:
        """The topic a stage consumes."""
        return {"intake": self.intake, "check": self.style, "generate": self.generate}[stage]

    def all(self) -> list[str]:
        return [self.intake, self.style, self.generate, self.notify, self.dead_letter]


# Required fields per stage and their types.
SCHEMAS: dict[str, dict[str, type]] = {
    "intake": {"request_id": str, "run_id": str, "user_id": str, "object_id": str,
               "produced_at": float},
    "check": {"request_id": str, "run_id": str, "style": str, "description": str,
              "produced_at": float},
    "generate": {"request_id": str, "run_id": str, "style": str, "description": str,
                 "produced_at": float},
}


def parse(stage: str, raw: bytes | None) -> dict[str, Any]:
    """Decode and validate an event for `stage`; raise InvalidEvent with the reason."""
    if raw is None:
        raise InvalidEvent("empty", "record has no value")
    if len(raw) > MAX_EVENT_BYTES:
        raise InvalidEvent("oversize", f"{len(raw)} bytes > {MAX_EVENT_BYTES}")
    try:
        event = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidEvent("malformed_json", str(exc)) from None
    if not isinstance(event, dict):
        raise InvalidEvent("malformed_json", f"expected an object, got {type(event).__name__}")
    for name, kind in SCHEMAS[stage].items():
        if name not in event:
            raise InvalidEvent("missing_field", name)
        value = event[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InvalidEvent("wrong_type", f"{name} must be {kind.__name__}")
    try:
        uuid.UUID(event["request_id"])
    except ValueError:
        raise InvalidEvent("wrong_type", "request_id must be a UUID") from None
    if "style" in SCHEMAS[stage] and event["style"] not in STYLES:
        raise InvalidEvent("unknown_style", f"{event['style']!r} not in {', '.join(STYLES)}")
    return event


def encode(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def intake_event(run_id: str, user_id: str, object_id: str, request_id: str | None = None) -> dict:
    """The storage-upload notification that starts a request."""
    return {"request_id": request_id or str(uuid.uuid4()), "run_id": run_id, "user_id": user_id,
            "object_id": object_id, "produced_at": time.time()}


def style_event(run_id: str, request_id: str, style: str, description: str) -> dict:
    """The user's style choice, sent by the bot."""
    return {"request_id": request_id, "run_id": run_id, "style": style,
            "description": description, "produced_at": time.time()}


def notification(request_id: str, run_id: str, kind: str, **fields: Any) -> dict:
    """A message for the bot: `choose_style`, `rejected`, `result` or `failed`."""
    return {"request_id": request_id, "run_id": run_id, "kind": kind, "at": time.time(), **fields}
