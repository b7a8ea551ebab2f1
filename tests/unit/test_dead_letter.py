"""Dead-letter records: headers, sizes, and the switch to by-reference exactly at the limit."""

from __future__ import annotations

import pytest

from consumers.config import profiles
from consumers.runtime import dead_letter
from consumers.runtime.dead_letter import DeadLetterRecord

ORIGIN = {"reason": "oversize", "detail": "d", "topic": "t", "partition": 0, "offset": 5,
          "stage": "check"}


def ours(original_size: int, reason: bytes = b"oversize") -> list[tuple[str, bytes]]:
    return [("reason", reason), ("detail", b"d"), ("source_topic", b"t"), ("source_partition", b"0"),
            ("source_offset", b"5"), ("stage", b"check"), ("original_size", str(original_size).encode())]


def test_a_record_that_fits_is_copied_with_its_headers_renamed() -> None:
    record = dead_letter.build(b"v" * 10, b"k", [("h", b"x"), ("reason", None)],
                               **{**ORIGIN, "reason": "malformed_json"})
    # original: value 10 + key 1 + headers (1+1+1+1) + (1+6+1+0) = 23
    assert record == DeadLetterRecord(
        b"v" * 10, b"k",
        [*ours(23, b"malformed_json"), ("source_header.h", b"x"), ("source_header.reason", None)],
        by_reference=False)


@pytest.mark.parametrize(("headers", "size"), [
    ([("h", b"x")], 4),
    ([("name", b"v" * 63)], 1 + 4 + 1 + 63),  # zigzag(63) = 126 < 128: one byte
    ([("name", b"v" * 64)], 1 + 4 + 2 + 64),  # zigzag(64) = 128: two bytes
    ([("name", None)], 1 + 4 + 1 + 0),
    ([("é", b"")], 1 + 2 + 1 + 0),  # the name counts in UTF-8 bytes
])
def test_headers_size_counts_names_values_and_varint_prefixes(headers: list, size: int) -> None:
    assert dead_letter.headers_size(headers) == size


# The record's headers for ORIGIN with a six-digit original_size:
# reason 1+6+1+8=16, detail 1+6+1+1=9, source_topic 1+12+1+1=15, source_partition 1+16+1+1=19,
# source_offset 1+13+1+1=16, stage 1+5+1+5=12, original_size 1+13+1+6=21: 108 bytes.
# The default limit leaves 1,000,000 - 1,024 = 998,976 bytes: a 998,868-byte value fits exactly.
LARGEST_COPIED_VALUE = 998_868


def test_the_largest_value_that_fits_is_copied() -> None:
    value = b"x" * LARGEST_COPIED_VALUE
    record = dead_letter.build(value, None, None, **ORIGIN)
    assert not record.by_reference
    assert record.value == value
    assert record.headers == ours(LARGEST_COPIED_VALUE)
    assert dead_letter.record_size(record.value, record.key, record.headers) == 998_976


def test_one_byte_more_goes_by_reference_with_sizes_and_a_prefix() -> None:
    record = dead_letter.build(b"x" * (LARGEST_COPIED_VALUE + 1), None, None, **ORIGIN)
    assert record == DeadLetterRecord(
        b"x" * 1024, None,
        [*ours(998_869), ("by_reference", b"true"), ("original_value_size", b"998869"),
         ("original_key_size", b"0"), ("original_headers_size", b"0")],
        by_reference=True)


@pytest.mark.parametrize(("key", "by_reference"), [(b"k", False), (b"kk", True)])
def test_the_key_counts_against_the_limit(key: bytes, by_reference: bool) -> None:
    # 998,867 + key; original_size still has six digits: 998,867 + 1 + 108 = 998,976 fits.
    record = dead_letter.build(b"x" * (LARGEST_COPIED_VALUE - 1), key, None, **ORIGIN)
    assert record.by_reference is by_reference
    assert record.key == (None if by_reference else key)


def test_huge_headers_go_by_reference_without_the_headers() -> None:
    headers = [(f"h{i:03d}", b"y" * 5000) for i in range(200)]  # each 1+4+2+5000 = 5,007 bytes
    record = dead_letter.build(b"{}", None, headers, **ORIGIN)
    assert record.by_reference
    assert record.value == b"{}"
    assert record.headers == [*ours(2 + 1_001_400), ("by_reference", b"true"),
                              ("original_value_size", b"2"), ("original_key_size", b"0"),
                              ("original_headers_size", b"1001400")]


def test_max_bytes_sets_the_boundary() -> None:
    # 100-byte value, original_size "100" (1+13+1+3 = 18): headers 105, record 205 bytes,
    # which fits max_bytes - 1,024 from max_bytes = 1,229 on.
    assert not dead_letter.build(b"x" * 100, None, None, **ORIGIN, max_bytes=1229).by_reference
    assert dead_letter.build(b"x" * 100, None, None, **ORIGIN, max_bytes=1228).by_reference


def test_a_null_value_stays_null() -> None:
    assert dead_letter.build(None, None, None, **ORIGIN) == DeadLetterRecord(None, None, ours(0), False)
    record = dead_letter.build(None, b"k" * 999_000, None, **ORIGIN)
    assert (record.value, record.key, record.by_reference) == (None, None, True)
    assert ("original_key_size", b"999000") in record.headers


@pytest.mark.parametrize(("detail", "expected"), [
    ("é" * 300, "é" * 250),  # 600 bytes -> 500
    ("a" + "é" * 300, "a" + "é" * 249),  # 601 bytes: byte 500 would split an "é" -> 499
    ("short", "short"),
    ("\ud800", "?"),  # a lone surrogate cannot be UTF-8: replaced
])
def test_detail_is_bounded_valid_utf8(detail: str, expected: str) -> None:
    headers = dict(dead_letter.build(b"v", None, None, **{**ORIGIN, "detail": detail}).headers)
    assert headers["detail"] == expected.encode()


def test_a_reference_stays_small_whatever_the_input() -> None:
    record = dead_letter.build(b"z" * 2_000_000, None, None,
                               **{**ORIGIN, "detail": "d" * 10_000, "topic": "t" * 249})
    # value 1024; headers: reason 16, detail 1+6+2+500=509, source_topic 1+12+2+249=264,
    # source_partition 19, source_offset 16, stage 12, original_size 1+13+1+7=22,
    # by_reference 1+12+1+4=18, original_value_size 1+19+1+7=28, original_key_size 1+17+1+1=20,
    # original_headers_size 1+21+1+1=24: 948.
    assert record.by_reference
    assert dead_letter.record_size(record.value, record.key, record.headers) == 1024 + 948


@pytest.mark.parametrize(("value", "stored"), [
    (None, None),
    (b"", b""),
    (b"a" * 65_536, b"a" * 65_536),
    (b"a" * 65_537, b"a" * 65_536),
])
def test_stored_payload_is_a_bounded_prefix(value: bytes | None, stored: bytes | None) -> None:
    assert dead_letter.stored_payload(value) == stored


def test_producer_limit_comes_from_the_profile_else_librdkafka_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert dead_letter.producer_max_bytes("durability") == 1_000_000
    big = profiles.Profile("big", "test", profiles.TopicSettings(1, 1),
                           producer={"message.max.bytes": 2_000_000})
    monkeypatch.setitem(profiles.PROFILES, "big", big)
    assert dead_letter.producer_max_bytes("big") == 2_000_000
