"""Events: their topics, and their decoding and validation against a stage's event schema.

Each stage reads one topic. An event that cannot be processed (not UTF-8 JSON, not an object,
too large or too deep, a duplicate key, a character PostgreSQL cannot store, or refused by the
stage's JSON Schema from its pipeline spec) raises `InvalidEvent` with a reason that the
consumer puts on the dead-letter record, so the partition moves on and nothing is lost.
`parse` raises nothing else, whatever the bytes. Reasons: `empty`, `oversize`, `malformed_json`
(not UTF-8, not JSON, or not an object), `too_deep`, `duplicate_key`, `non_finite_number`,
`out_of_range` (also a schema's minimum/maximum), `nul_character`, `invalid_unicode`, and from the
schema `missing_field`, `wrong_type` (type, pattern or format), `unknown_<field>` (a value not in
the field's enum) and `invalid` (any other schema keyword).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jsonschema import Validator
from jsonschema.exceptions import ValidationError, best_match

from consumers.config.pipeline_spec import DEAD_LETTER, PipelineSpec

MAX_EVENT_BYTES = 64 * 1024
# Events are flat objects (depth 1); the bound leaves room for nested extra fields and keeps
# json's recursive decoder far from the interpreter's recursion limit.
MAX_DEPTH = 8
# Longer integer literals lie beyond 64 bits: no field needs them, and converting them costs time
# quadratic in their length (why CPython caps int() at 4300 digits).
MAX_INT_LITERAL = 20
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


def canary_group(group_id: str, canary_id: int | str) -> str:
    """The group a canary's members commit under (`canary_id` "" gives every canary's prefix):
    apart from the active group, whose coordinator refuses commits from consumers outside it
    while it has live members."""
    return f"{group_id}.canary-{canary_id}"


@dataclass(frozen=True)
class Topics:
    """The topics of one run of a pipeline: each spec topic as `<prefix>.<name>`, so runs are
    kept apart, plus the run's dead-letter topic."""

    prefix: str
    spec: PipelineSpec

    def name(self, topic: str) -> str:
        return f"{self.prefix}.{topic}"

    @property
    def dead_letter(self) -> str:
        return self.name(DEAD_LETTER)

    def source_of(self, stage: str) -> str:
        """The topic a stage consumes."""
        return self.name(self.spec.stages[stage].source)

    def outputs_of(self, stage: str) -> list[str]:
        """The topics a stage writes: its routes' topics and the dead-letter topic."""
        return [*(self.name(t) for t in self.spec.outputs_of(stage)), self.dead_letter]

    def group_of(self, stage: str) -> str:
        """The consumer group of a stage's fleet."""
        return f"{self.prefix}.{stage}"

    def canary_groups_of(self, stage: str) -> str:
        """The prefix of the groups a stage's canaries commit under (`canary_group`)."""
        return canary_group(self.group_of(stage), "")

    def producing(self) -> list[str]:
        """The topics the load source writes."""
        return [self.name(t) for t in self.spec.producing_topics()]

    def all(self) -> list[str]:
        return [*(self.name(t) for t in self.spec.topics), self.dead_letter]


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


def parse(validator: Validator, raw: bytes | None) -> dict[str, Any]:
    """Decode an event and validate it with a stage's schema; raise InvalidEvent with the reason."""
    if not raw:
        raise InvalidEvent("empty", "record has no value" if raw is None else "record value is empty")
    if len(raw) > MAX_EVENT_BYTES:
        raise InvalidEvent("oversize", f"{len(raw)} bytes > {MAX_EVENT_BYTES}")
    event = _decode(raw)
    if not isinstance(event, dict):
        raise InvalidEvent("malformed_json", f"expected an object, got {type(event).__name__}")
    if b"\\u" in raw:  # strict JSON and UTF-8 let U+0000 and surrogates in only as \u escapes
        _check_storable(event)
    error = best_match(validator.iter_errors(event))
    if error is not None:
        raise _refusal(error)
    return event


def _refusal(error: ValidationError) -> InvalidEvent:
    """The reason a schema refused an event, in the consumer's vocabulary."""
    at = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "required":
        missing = next(f for f in error.validator_value if f not in error.instance)
        return InvalidEvent("missing_field", f"{at + '.' if at else ''}{missing}")
    if error.validator in ("type", "pattern", "format"):
        return InvalidEvent("wrong_type", f"{at or 'event'}: {error.message[:200]}")
    if error.validator == "enum":
        return InvalidEvent(f"unknown_{at or 'value'}", f"{str(error.instance)[:40]!r} not in "
                                                       f"{', '.join(map(str, error.validator_value))}")
    if error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return InvalidEvent("out_of_range", f"{at}: {error.message[:200]}")
    return InvalidEvent("invalid", f"{at or 'event'}: {error.message[:200]}")


def encode(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()
