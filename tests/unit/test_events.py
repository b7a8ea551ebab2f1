"""Validation reasons for every kind of bad input, and parse's boundaries."""

from __future__ import annotations

import json
import random
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from consumers.config import events, pipeline_spec
from tests import bad_input
from tests.bad_input import BadInput

REFERENCE = pipeline_spec.load("genai_image")


def parse(raw: bytes | None) -> dict:
    """The reference pipeline's check stage: the boundaries below are the parser's own."""
    return events.parse(REFERENCE.validators["check"], raw)


def valid_style() -> dict:
    return {"request_id": str(uuid.uuid4()), "run_id": "run", "style": "minimal", "description": "slides",
            "produced_at": 1_700_000_000.0}


def reason_of(raw: bytes | None) -> str:
    with pytest.raises(events.InvalidEvent) as info:
        parse(raw)
    return info.value.reason


@pytest.mark.parametrize(("raw", "reason"), [
    (None, "empty"),
    (b"", "empty"),
    (b"{not json", "malformed_json"),
    (b"\xff\xfe", "malformed_json"),
    (b"[1, 2]", "malformed_json"),
    (b"x" * (events.MAX_EVENT_BYTES + 1), "oversize"),
])
def test_undecodable_input(raw: bytes | None, reason: str) -> None:
    assert reason_of(raw) == reason


@pytest.mark.parametrize(("change", "reason"), [
    ({"style": None}, "wrong_type"),
    ({"produced_at": "yesterday"}, "wrong_type"),
    ({"produced_at": True}, "wrong_type"),
    ({"request_id": "not-a-uuid"}, "wrong_type"),
    ({"style": "baroque"}, "unknown_style"),
])
def test_field_problems(change: dict, reason: str) -> None:
    assert reason_of(json.dumps({**valid_style(), **change}).encode()) == reason


def test_missing_field_is_named() -> None:
    event = valid_style()
    del event["description"]
    with pytest.raises(events.InvalidEvent) as info:
        parse(json.dumps(event).encode())
    assert (info.value.reason, info.value.detail) == ("missing_field", "description")


def test_valid_event_round_trips_with_integer_timestamp() -> None:
    event = {**valid_style(), "produced_at": 1700000000}
    assert parse(events.encode(event))["produced_at"] == 1700000000


# ----------------------------------------------------------------- the corpus
STAGES = bad_input.cases()
STAGE_IDS = [f"{spec.name}-{stage}" for spec, stage in STAGES]
CASES = [(spec, stage, case) for spec, stage in STAGES for case in bad_input.corpus(spec, stage)]


@pytest.mark.parametrize(("spec", "stage", "case"), CASES,
                         ids=[f"{p.name}-{s}-{c.name}" for p, s, c in CASES])
def test_every_corpus_case_is_refused_for_its_reason(spec: pipeline_spec.PipelineSpec, stage: str,
                                                     case: BadInput) -> None:
    with pytest.raises(events.InvalidEvent) as info:
        bad_input.parse(spec, stage, case.value)
    assert info.value.reason == case.reason, info.value.detail
    assert "\x00" not in info.value.detail  # the detail goes to a PostgreSQL text column


@pytest.mark.parametrize(("spec", "stage"), STAGES, ids=STAGE_IDS)
def test_each_corpus_is_built_from_a_valid_event(spec: pipeline_spec.PipelineSpec, stage: str) -> None:
    event = bad_input.valid_event(spec, stage)
    assert bad_input.parse(spec, stage, json.dumps(event, ensure_ascii=False).encode()) == event


def test_every_shipped_pipeline_has_its_corpus() -> None:
    assert {spec.name for spec, _ in STAGES} == {"genai_image", "text_moderation", "support_tickets"}
    assert len(STAGES) == 3 + 4 + 2


@pytest.mark.parametrize(("spec", "stage"), STAGES, ids=STAGE_IDS)
def test_the_corpus_covers_every_required_kind(spec: pipeline_spec.PipelineSpec, stage: str) -> None:
    names = [case.name for case in bad_input.corpus(spec, stage)]
    assert len(names) == len(set(names)) == 31
    assert {"invalid_json", "truncated_utf8", "empty_value", "null_value", "json_array",
            "missing_field", "bool_for_float", "float_for_string", "negative_timestamp", "nan",
            "overflowing_float", "deep_nesting", "unknown_enum", "oversize", "over_producer_limit",
            "binary_noise", "duplicate_keys", "huge_key", "huge_headers", "nul_character",
            "not_a_uuid"} <= set(names)


def test_the_large_cases_have_their_sizes() -> None:
    cases = {case.name: case for case in bad_input.corpus(REFERENCE, "check")}
    assert len(cases["over_producer_limit"].value) == 1_020_000
    assert len(cases["oversize"].value) == events.MAX_EVENT_BYTES + 10
    assert len(cases["huge_key"].key) == 100_000
    assert sum(len(n) + len(v) for n, v in cases["huge_headers"].headers) == 200 * (4 + 1000)
    truncated = cases["truncated_utf8"].value
    assert truncated.endswith(b"\xe2")  # the first of the three bytes of U+2615


def test_the_over_limit_case_needs_a_producer_with_a_raised_limit() -> None:
    value = {case.name: case for case in bad_input.corpus(REFERENCE, "check")}["over_producer_limit"].value
    # librdkafka checks the size when the record is queued: no broker is contacted.
    nowhere = {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}
    with pytest.raises(KafkaException) as info:
        Producer(nowhere).produce("t", value=value)
    assert info.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    raised = Producer({**nowhere, "message.max.bytes": 1_048_576})
    raised.produce("t", value=value)  # queued: accepted
    raised.purge()


# ----------------------------------------------------------------- boundaries
def with_extra(literal: str) -> bytes:
    """A valid style event (always the same) with an `extra` field holding a raw JSON literal."""
    event = {**bad_input.valid_event(REFERENCE, "check"), "description": "slides", "extra": "@"}
    return events.encode(event).replace(b'"@"', literal.encode())


def test_size_limit_is_inclusive() -> None:
    base = with_extra('""')
    fill = events.MAX_EVENT_BYTES - len(base)
    exact = with_extra('"' + "x" * fill + '"')
    assert len(exact) == events.MAX_EVENT_BYTES
    assert parse(exact)["extra"] == "x" * fill
    assert reason_of(with_extra('"' + "x" * (fill + 1) + '"')) == "oversize"


def test_nesting_depth_bound() -> None:
    # The event object is depth 1: an extra field nested 7 deep reaches MAX_DEPTH = 8.
    assert parse(with_extra("[" * 7 + "]" * 7))["extra"] == [[[[[[[]]]]]]]
    assert reason_of(with_extra("[" * 8 + "]" * 8)) == "too_deep"
    assert reason_of(with_extra('{"a":' * 8 + "1" + "}" * 8)) == "too_deep"
    # Brackets inside strings are text, not nesting (including after an escaped quote).
    assert parse(with_extra('"\\"' + "[" * 50 + '"'))["extra"] == '"' + "[" * 50


@pytest.mark.parametrize(("produced_at", "reason"), [
    (946_684_800.0, None),  # 2000-01-01T00:00:00Z
    (946_684_799.999, "out_of_range"),
    (4_102_444_799.0, None),  # 2099-12-31T23:59:59Z
    (4_102_444_800.0, "out_of_range"),  # 2100-01-01T00:00:00Z
    (0, "out_of_range"),
])
def test_produced_at_bounds(produced_at: float, reason: str | None) -> None:
    raw = events.encode({**valid_style(), "produced_at": produced_at})
    if reason is None:
        assert parse(raw)["produced_at"] == produced_at
    else:
        assert reason_of(raw) == reason


def test_integer_literals_beyond_64_bits_are_refused() -> None:
    assert parse(with_extra("9" * 20))["extra"] == int("9" * 20)
    assert parse(with_extra("-" + "9" * 19))["extra"] == -int("9" * 19)
    assert reason_of(with_extra("9" * 21)) == "out_of_range"


@pytest.mark.parametrize("spelling", [
    "{7f1c4a36-5a5c-4d8e-9a57-2f5f1b9c0d11}",
    "urn:uuid:7f1c4a36-5a5c-4d8e-9a57-2f5f1b9c0d11",
    "7f1c4a365a5c4d8e9a572f5f1b9c0d11",
    "7F1C4A36-5A5C-4D8E-9A57-2F5F1B9C0D11",
])
def test_request_id_must_be_a_canonical_uuid(spelling: str) -> None:
    assert str(uuid.UUID(spelling)) == "7f1c4a36-5a5c-4d8e-9a57-2f5f1b9c0d11"  # the same UUID
    assert reason_of(events.encode({**valid_style(), "request_id": spelling})) == "wrong_type"


@pytest.mark.parametrize(("literal", "reason"), [
    ('{"a": 1, "a": 1}', "duplicate_key"),  # nested objects too, even with equal values
    ('["a\\u0000"]', "nul_character"),  # inside a list
    ('{"k\\u0000": 1}', "nul_character"),  # in a key
    ('"\\udfff"', "invalid_unicode"),
    ('"\\ud83d\\ude00"', None),  # a surrogate pair is a character (U+1F600)
    ('"\\\\u0000"', None),  # an escaped backslash followed by "u0000" is text
    ('"a\x00b"', "malformed_json"),  # a raw NUL: strict JSON refuses control characters
    ("-1e400", "out_of_range"),
    ("1e308", None),
])
def test_nested_values(literal: str, reason: str | None) -> None:
    if reason is None:
        parse(with_extra(literal))
    else:
        assert reason_of(with_extra(literal)) == reason


def test_a_raw_surrogate_is_not_utf8() -> None:
    assert reason_of(with_extra('"a@"').replace(b"@", b"\xed\xa0\x80")) == "malformed_json"


def test_duplicate_key_detail_names_the_key() -> None:
    raw = b'{"request_id": "a", "request_id": "b"}'
    with pytest.raises(events.InvalidEvent) as info:
        parse(raw)
    assert (info.value.reason, info.value.detail) == ("duplicate_key", "'request_id' appears more than once")


# ----------------------------------------------------------------- nothing but InvalidEvent
def test_every_prefix_of_a_valid_event_is_refused_cleanly() -> None:
    raw = json.dumps(bad_input.valid_event(REFERENCE, "check"), ensure_ascii=False).encode()
    reasons = {reason_of(raw[:cut]) for cut in range(len(raw))}
    assert reasons == {"empty", "malformed_json"}


def test_random_mutations_raise_nothing_but_invalid_event() -> None:
    rng = random.Random(11)
    raw = bytearray(json.dumps(bad_input.valid_event(REFERENCE, "check")).encode())
    refused = 0
    for _ in range(3000):
        mutated = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.choice(b'{}[]",:\\0123456789eE.-+ \x00\xff\xc3nNtf')
        try:
            parse(bytes(mutated))
        except events.InvalidEvent:
            refused += 1
    assert refused > 2000  # most mutations break the event: the loop did exercise parse
