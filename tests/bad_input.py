"""A corpus of bad input for each stage's input topic of any pipeline spec, with the reason each
must be refused for.

Every case is a whole Kafka record (value, key, headers), built from a valid event of the
stage (from the spec's load generator, checked against the stage's schema) so that exactly one
thing is wrong with it. The fields it breaks are read from the stage's JSON Schema: a free-text
field, a required one to leave out, an enum field when there is one. The unit tests check the
reasons against `events.parse`; the integration test sends the corpus through the pipeline.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from consumers.config import events, pipeline_spec
from consumers.config.pipeline_spec import PipelineSpec

REQUEST_ID = "7f1c4a36-5a5c-4d8e-9a57-2f5f1b9c0d11"
OTHER_REQUEST_ID = "0b9e2d7c-3f41-4c55-8e0a-6d2f9c1b7a42"
PRODUCED_AT = 1_700_000_000.0  # 2023-11-14
# A value over librdkafka's default message.max.bytes (1,000,000) and under the broker's default
# max.message.bytes (1,048,588 per record batch): only a producer with a raised limit sends it.
OVER_PRODUCER_LIMIT_BYTES = 1_020_000
HUGE_KEY_BYTES = 100_000
HUGE_HEADERS = 200  # headers of 1,000 bytes each: ~200 KB
# A multi-byte character whose UTF-8 encoding the truncated case cuts after its first byte.
MULTIBYTE = "☕"  # 3 bytes: e2 98 95


@dataclass(frozen=True)
class BadInput:
    """One bad record and the reason `events.parse` must give for it."""

    name: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]] | None
    reason: str


def cases() -> list[tuple[PipelineSpec, str]]:
    """(spec, stage) of every stage of every shipped pipeline."""
    specs = [pipeline_spec.load(name) for name in pipeline_spec.available()]
    return [(spec, stage) for spec in specs for stage in spec.stages]


def parse(spec: PipelineSpec, stage: str, raw: bytes | None) -> dict[str, Any]:
    return events.parse(spec.validators[stage], raw)


def _properties(spec: PipelineSpec, stage: str) -> dict[str, dict[str, Any]]:
    return spec.stages[stage].event_schema.get("properties", {})


def _completed(spec: PipelineSpec, stage: str, event: dict[str, Any]) -> dict[str, Any]:
    """The event with the string fields an earlier stage adds (a later stage requires them)."""
    schema = spec.stages[stage].event_schema
    added = {name: "added" for name in schema.get("required", []) if name not in event
             and _properties(spec, stage).get(name, {}).get("type") == "string"}
    return {**event, **added}


def valid_event(spec: PipelineSpec, stage: str) -> dict[str, Any]:
    """A valid event of the stage, fixed so that every corpus is the same from run to run."""
    generator = pipeline_spec.resolve(spec.load.generator)
    generated = [_completed(spec, stage, event) for _, event in generator(random.Random(3), "run", 1, 0.0)]
    event = next(e for e in generated if not list(spec.validators[stage].iter_errors(e)))
    event = {**event, spec.key: REQUEST_ID, "produced_at": PRODUCED_AT}
    text = spec.stages[stage].free_text_field(spec.key)
    return {**event, text: f"{event[text]} {MULTIBYTE}"}


def _encode(event: dict[str, Any]) -> bytes:
    """JSON as sent, with non-ASCII characters as UTF-8 (json.dumps would escape them)."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()


def _with_literal(event: dict[str, Any], name: str, literal: str) -> bytes:
    """The event with a field set to a JSON literal json.dumps would never write (1e400, NaN)."""
    return _encode({**event, name: "@"}).replace(b'"@"', literal.encode())


def _truncated_utf8(event: dict[str, Any]) -> bytes:
    """The event cut after the first byte of its multi-byte character."""
    raw = _encode(event)
    return raw[:raw.index(MULTIBYTE.encode()) + 1]


def corpus(spec: PipelineSpec, stage: str) -> list[BadInput]:
    """Every kind of bad input for the stage, each with its expected reason."""
    event = valid_event(spec, stage)
    raw = _encode(event)
    text = spec.stages[stage].free_text_field(spec.key)
    required = spec.stages[stage].event_schema["required"]
    omitted = [f for f in required if f not in (spec.key, *pipeline_spec.RUN_FIELDS)][-1]
    enum_field = next((name for name, schema in _properties(spec, stage).items() if "enum" in schema), None)
    if enum_field is None:  # no enum field: the key's spelling is the value check
        enum = BadInput("unknown_enum", _encode({**event, spec.key: REQUEST_ID.upper()}),
                        None, None, "wrong_type")
    else:
        enum = BadInput("unknown_enum", _encode({**event, enum_field: "baroque"}), None, None,
                        f"unknown_{enum_field}")
    return [
        BadInput("invalid_json", raw[:-1], None, None, "malformed_json"),
        BadInput("truncated_utf8", _truncated_utf8(event), None, None, "malformed_json"),
        BadInput("utf16_encoded", json.dumps(event).encode("utf-16"), None, None, "malformed_json"),
        BadInput("utf8_bom", b"\xef\xbb\xbf" + raw, None, None, "malformed_json"),
        BadInput("empty_value", b"", None, None, "empty"),
        BadInput("null_value", None, None, None, "empty"),
        BadInput("json_array", b"[1, 2]", None, None, "malformed_json"),
        BadInput("json_string", b'"request"', None, None, "malformed_json"),
        BadInput("json_number", b"42", None, None, "malformed_json"),
        BadInput("json_null", b"null", None, None, "malformed_json"),
        BadInput("missing_field", _encode({k: v for k, v in event.items() if k != omitted}),
                 None, None, "missing_field"),
        BadInput("bool_for_float", _encode({**event, "produced_at": True}), None, None, "wrong_type"),
        BadInput("float_for_string", _encode({**event, "run_id": 1.5}), None, None, "wrong_type"),
        BadInput("not_a_uuid", _encode({**event, spec.key: "not-a-uuid"}), None, None,
                 "wrong_type"),
        BadInput("negative_timestamp", _encode({**event, "produced_at": -1.0}), None, None,
                 "out_of_range"),
        BadInput("milliseconds_timestamp", _encode({**event, "produced_at": PRODUCED_AT * 1000}),
                 None, None, "out_of_range"),
        BadInput("overflowing_float", _with_literal(event, "produced_at", "1e400"), None, None,
                 "out_of_range"),
        BadInput("huge_integer", _with_literal(event, "produced_at", "1" + "0" * 40), None, None,
                 "out_of_range"),
        BadInput("nan", _with_literal(event, "produced_at", "NaN"), None, None, "non_finite_number"),
        BadInput("infinity", _with_literal(event, "produced_at", "Infinity"), None, None,
                 "non_finite_number"),
        BadInput("minus_infinity", _with_literal(event, "produced_at", "-Infinity"), None, None,
                 "non_finite_number"),
        BadInput("deep_nesting", _with_literal(event, "extra", "[" * 5000 + "]" * 5000), None, None,
                 "too_deep"),
        enum,
        BadInput("oversize", b'{"pad":"' + b"x" * events.MAX_EVENT_BYTES + b'"}', None, None,
                 "oversize"),
        BadInput("over_producer_limit", b'{"pad":"' + b"x" * (OVER_PRODUCER_LIMIT_BYTES - 10) + b'"}',
                 None, None, "oversize"),
        BadInput("binary_noise", random.Random(7).randbytes(512), None, None, "malformed_json"),
        BadInput("duplicate_keys", raw.replace(b"{", f'{{"{spec.key}":"{OTHER_REQUEST_ID}",'.encode(), 1),
                 None, None, "duplicate_key"),
        BadInput("huge_key", raw[:-1], b"k" * HUGE_KEY_BYTES, None, "malformed_json"),
        BadInput("huge_headers", raw[:-1], None,
                 [(f"h{i:03d}", b"h" * 1000) for i in range(HUGE_HEADERS)], "malformed_json"),
        BadInput("nul_character", _encode({**event, text: "a\u0000b"}), None, None, "nul_character"),
        # json.dumps escapes the surrogate as \ud800: the only way one reaches a UTF-8 record.
        BadInput("lone_surrogate", json.dumps({**event, text: "a\ud800b"}).encode(), None, None,
                 "invalid_unicode"),
    ]
