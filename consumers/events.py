"""The pipeline's events, their topics and their validation.

Each stage reads one topic. An event that cannot be processed (not UTF-8 JSON, not an object,
a missing or ill-typed field, a number out of range, too large or too deep, a duplicate key, a
character PostgreSQL cannot store, an unknown style) raises `InvalidEvent` with a reason that
the consumer puts on the dead-letter record, so the partition moves on and nothing is lost.
`parse` raises nothing else, whatever the bytes. Reasons: `empty`, `oversize`, `malformed_json`
(not UTF-8, not JSON, or not an object), `too_deep`, `duplicate_key`, `non_finite_number`,
`out_of_range`, `nul_character`, `invalid_unicode`, `missing_field`, `wrong_type` (including a
request_id that is not a canonical UUID), `unknown_style`.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAX_EVENT_BYTES = 64 * 1024
# Events are flat objects (depth 1); the bound leaves room for nested extra fields and keeps
# json's recursive decoder far from the interpreter's recursion limit.
MAX_DEPTH = 8
# Longer integer literals lie beyond 64 bits: no field needs them, and converting them costs time
# quadratic in their length (why CPython caps int() at 4300 digits).
MAX_INT_LITERAL = 20
# produced_at bounds, epoch seconds. 2000-01-01: earlier than anything this platform produced,
# so a replay of retained records is never refused, while 0, negatives and other defaults are.
# 2100-01-01: milliseconds or microseconds sent as seconds (1.7e12 s is past the year 50,000) land
# beyond it while any real clock skew stays inside. Both are well inside what `datetime` (years
# 1-9999) and PostgreSQL's timestamptz can represent, so the stored timestamp never fails.
MIN_PRODUCED_AT = 946_684_800.0  # 2000-01-01T00:00:00Z
MAX_PRODUCED_AT = 4_102_444_800.0  # 2100-01-01T00:00:00Z
STYLES = ("minimal", "corporate", "playful", "academic", "dark")
STAGES = ("intake", "check", "generate")

# A JSON string (unrolled loop: linear time) and the brackets left once strings are removed.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_SURROGATE = re.compile("[\ud800-\udfff]")


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

    def outputs_of(self, stage: str) -> list[str]:
        """The topics a stage writes: its downstream events and the dead-letter topic."""
        downstream = {"intake": [self.notify], "check": [self.generate, self.notify],
                      "generate": [self.notify]}[stage]
        return [*downstream, self.dead_letter]

    def group_of(self, stage: str) -> str:
        """The consumer group of a stage's fleet."""
        return f"{self.prefix}.{stage}"

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


def _int(literal: str) -> int:
    """An integer literal, refused before conversion when it is longer than any field needs."""
    if len(literal) > MAX_INT_LITERAL:
        raise InvalidEvent("out_of_range", f"integer literal of {len(literal)} characters")
    return int(literal)


def _float(literal: str) -> float:
    """A float literal; one too large for a double (1e400) would silently become inf."""
    value = float(literal)
    if math.isinf(value):
        raise InvalidEvent("out_of_range", f"{literal[:40]} overflows a double")
    return value


def _constant(literal: str) -> float:
    """NaN and Infinity: Python's json accepts them, JSON does not, and no field can hold them."""
    raise InvalidEvent("non_finite_number", literal)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are unique: with two `request_id`s, which one is meant is a guess."""
    event = dict(pairs)
    if len(event) != len(pairs):
        repeated = next(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
        raise InvalidEvent("duplicate_key", f"{repeated!r} appears more than once")
    return event


def _too_deep(text: str) -> bool:
    """Nesting beyond MAX_DEPTH, found before json's recursive decoder descends into it."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False  # too few brackets to nest that deep: the usual case, no scan needed
    depth = 0
    for bracket in _BRACKETS.findall(_JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def _strings(node: Any) -> Iterator[str]:
    """Every key and string value of a decoded document."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield key
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def _check_storable(event: dict[str, Any]) -> None:
    """PostgreSQL text cannot hold U+0000, and a lone surrogate cannot be encoded as UTF-8."""
    for text in _strings(event):
        if "\x00" in text:
            raise InvalidEvent("nul_character", f"U+0000 in {text[:40]!r}")
        if _SURROGATE.search(text):
            raise InvalidEvent("invalid_unicode", f"lone surrogate in {text[:40]!r}")


def _decode(raw: bytes) -> Any:
    """UTF-8 JSON (RFC 8259) with every number finite, every key unique, nesting bounded."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidEvent("malformed_json", f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    if _too_deep(text):
        raise InvalidEvent("too_deep", f"nesting deeper than {MAX_DEPTH}")
    try:
        return json.loads(text, object_pairs_hook=_object, parse_int=_int, parse_float=_float,
                          parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise InvalidEvent("malformed_json", str(exc)) from None


def parse(stage: str, raw: bytes | None) -> dict[str, Any]:
    """Decode and validate an event for `stage`; raise InvalidEvent with the reason."""
    if not raw:
        raise InvalidEvent("empty", "record has no value" if raw is None else "record value is empty")
    if len(raw) > MAX_EVENT_BYTES:
        raise InvalidEvent("oversize", f"{len(raw)} bytes > {MAX_EVENT_BYTES}")
    event = _decode(raw)
    if not isinstance(event, dict):
        raise InvalidEvent("malformed_json", f"expected an object, got {type(event).__name__}")
    if b"\\u" in raw:  # strict JSON and UTF-8 let U+0000 and surrogates in only as \u escapes
        _check_storable(event)
    for name, kind in SCHEMAS[stage].items():
        if name not in event:
            raise InvalidEvent("missing_field", name)
        value = event[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InvalidEvent("wrong_type", f"{name} must be {kind.__name__}")
    try:
        canonical = str(uuid.UUID(event["request_id"])) == event["request_id"]
    except ValueError:
        canonical = False
    if not canonical:
        # Another spelling of the same UUID would be another request row.
        raise InvalidEvent("wrong_type", "request_id must be a UUID in canonical form")
    if "style" in SCHEMAS[stage] and event["style"] not in STYLES:
        raise InvalidEvent("unknown_style", f"{event['style'][:40]!r} not in {', '.join(STYLES)}")
    if not MIN_PRODUCED_AT <= event["produced_at"] < MAX_PRODUCED_AT:
        raise InvalidEvent("out_of_range", f"produced_at {event['produced_at']!r} outside "
                                           f"[{MIN_PRODUCED_AT:.0f}, {MAX_PRODUCED_AT:.0f})")
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
