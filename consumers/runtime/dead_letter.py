"""The dead-letter record of a consumed record, bounded so dead-lettering itself cannot fail.

A record that cannot be processed goes to `<prefix>.dlq` with headers saying why and where it
came from. The input may be as large as the broker accepts (a topic admits ~1 MiB, a producer
sends 1,000,000 bytes by default), and a copy of it plus the headers can exceed the
dead-letter producer's `message.max.bytes`: librdkafka refuses such a record with
MSG_SIZE_TOO_LARGE, the consumer could not complete the offset and the partition would stall.
Such a record is therefore dead-lettered *by reference*: its origin (topic, partition, offset)
and sizes in headers, a short prefix of its value as the record value, its key and headers
left out. The `dead_letters` table keeps a bounded prefix of the value for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from consumers.config import profiles
from consumers.kafka_clients.records import Header

# librdkafka's `message.max.bytes` default: what a producer sends unless configured otherwise.
LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000
# Kept free below `message.max.bytes`: librdkafka adds up to 36 bytes of record framing before
# comparing with it (RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD) and the broker 61 bytes of batch header.
RECORD_MARGIN_BYTES = 1024
DETAIL_MAX_BYTES = 500
REASON_MAX_BYTES = 64
VALUE_PREFIX_BYTES = 1024  # the record value of a dead letter by reference
STORED_PAYLOAD_BYTES = 64 * 1024  # dead_letters.payload
# A copied header of the original record is renamed so it cannot be mistaken for one of ours.
SOURCE_HEADER_PREFIX = "source_header."

# A redriven record's headers (`consumers.runs.redrive`): how many times it has been sent back, and
# the dead letter it came from. The round restarts the record's try budget (`consumers.runtime.stages`).
REDRIVE_COUNT_HEADER = "redrive_count"
DEAD_LETTER_ID_HEADER = "dead_letter_id"


@dataclass(frozen=True)
class DeadLetterRecord:
    """What to send to the dead-letter topic (`headers` is a list: the client takes no tuple)."""

    value: bytes | None
    key: bytes | None
    headers: list[Header]
    by_reference: bool


def producer_max_bytes(profile: str) -> int:
    """The `message.max.bytes` of a profile's producers: theirs if set, else librdkafka's."""
    return int(profiles.get(profile).producer.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES))


def _varint_size(n: int) -> int:
    """Bytes of a length as a Kafka (zigzag) varint: never less than librdkafka counts."""
    zigzag, size = n << 1, 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def headers_size(headers: list[Header]) -> int:
    """Serialized size of record headers: each name and value with its length prefix."""
    total = 0
    for name, value in headers:
        encoded = len(name.encode())
        total += _varint_size(encoded) + encoded + _varint_size(len(value or b"")) + len(value or b"")
    return total


def record_size(value: bytes | None, key: bytes | None, headers: list[Header]) -> int:
    """Value, key and serialized headers: what counts against `message.max.bytes`."""
    return len(value or b"") + len(key or b"") + headers_size(headers)


def _bounded_text(text: str, limit: int) -> bytes:
    """At most `limit` bytes of UTF-8, never ending inside a character."""
    return text.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore").encode()


def build(value: bytes | None, key: bytes | None, headers: list[Header] | None, *, reason: str,
          detail: str, topic: str, partition: int, offset: int, stage: str,
          max_bytes: int = LIBRDKAFKA_MESSAGE_MAX_BYTES) -> DeadLetterRecord:
    """The dead letter of one consumed record: a copy when it fits `max_bytes`, else a reference.

    Headers: `reason`, `detail` (bounded), `source_topic`, `source_partition`, `source_offset`,
    `stage`, `original_size` (value + key + serialized headers of the consumed record); a copy
    adds the record's own headers renamed `source_header.<name>`, a reference adds
    `by_reference: true`, `original_value_size`, `original_key_size`, `original_headers_size`.
    A reference stays under ~2.5 KB whatever the input, far below any usable `max_bytes`.
    """
    original = list(headers or [])
    ours: list[Header] = [
        ("reason", _bounded_text(reason, REASON_MAX_BYTES)),
        ("detail", _bounded_text(detail, DETAIL_MAX_BYTES)),
        ("source_topic", topic.encode()),
        ("source_partition", str(partition).encode()),
        ("source_offset", str(offset).encode()),
        ("stage", stage.encode()),
        ("original_size", str(record_size(value, key, original)).encode()),
    ]
    copy = ours + [(SOURCE_HEADER_PREFIX + name, v) for name, v in original]
    if record_size(value, key, copy) <= max_bytes - RECORD_MARGIN_BYTES:
        return DeadLetterRecord(value, key, copy, by_reference=False)
    reference = [
        *ours,
        ("by_reference", b"true"),
        ("original_value_size", str(len(value or b"")).encode()),
        ("original_key_size", str(len(key or b"")).encode()),
        ("original_headers_size", str(headers_size(original)).encode()),
    ]
    prefix = value[:VALUE_PREFIX_BYTES] if value is not None else None
    return DeadLetterRecord(prefix, None, reference, by_reference=True)


def redrive_round(headers: list[Header] | None) -> int:
    """The record's redrive round: its `redrive_count` header, 0 when it has none (or a bad one:
    a header someone else wrote is no reason to refuse the record)."""
    for name, value in headers or ():
        if name == REDRIVE_COUNT_HEADER:
            try:
                return max(0, int(value or b""))
            except ValueError:
                return 0
    return 0


def stored_payload(value: bytes | None) -> bytes | None:
    """The value as kept in `dead_letters.payload`: a bounded prefix, so the insert is bounded."""
    return value[:STORED_PAYLOAD_BYTES] if value is not None else None
