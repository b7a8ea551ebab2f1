"""Validation reasons for every kind of bad input."""

from __future__ import annotations

import json
import uuid

import pytest

from consumers import events


def valid_style() -> dict:
    return events.style_event("run", str(uuid.uuid4()), "minimal", "slides")


@pytest.mark.parametrize(("raw", "reason"), [
    (None, "empty"),
    (b"{not json", "malformed_json"),
    (b"\xff\xfe", "malformed_json"),
    (b"[1, 2]", "malformed_json"),
    (b"x" * (events.MAX_EVENT_BYTES + 1), "oversize"),
])
def test_undecodable_input(raw: bytes | None, reason: str) -> None:
    with pytest.raises(events.InvalidEvent) as info:
        events.parse("check", raw)
    assert info.value.reason == reason


@pytest.mark.parametrize(("change", "reason"), [
    ({"style": None}, "wrong_type"),
    ({"produced_at": "yesterday"}, "wrong_type"),
    ({"produced_at": True}, "wrong_type"),
    ({"request_id": "not-a-uuid"}, "wrong_type"),
    ({"style": "baroque"}, "unknown_style"),
])
def test_field_problems(change: dict, reason: str) -> None:
    event = {**valid_style(), **change}
    with pytest.raises(events.InvalidEvent) as info:
        events.parse("check", json.dumps(event).encode())
    assert info.value.reason == reason


def test_missing_field_is_named() -> None:
    event = valid_style()
    del event["description"]
    with pytest.raises(events.InvalidEvent) as info:
        events.parse("check", json.dumps(event).encode())
    assert (info.value.reason, info.value.detail) == ("missing_field", "description")


def test_valid_event_round_trips_with_integer_timestamp() -> None:
    event = {**valid_style(), "produced_at": 1700000000}
    assert events.parse("check", events.encode(event))["produced_at"] == 1700000000
