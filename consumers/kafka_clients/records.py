"""A record the client hands back: where it sits and what its headers are.

The client's `Message` serves every path, so its hints leave the topic, partition, offset and
delivery count optional and allow any header form a producer may be given. A record a poll
returned without an error, or one whose delivery was reported without one, has its place; its
headers are a list of (name, value) pairs. These accessors say so once for the members, their
buffer and the producer, and refuse a message that breaks it rather than pass a None on.
"""

from __future__ import annotations

from typing import cast

from confluent_kafka import Message

Header = tuple[str, bytes | None]


def place(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed or delivered record."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if topic is None or partition is None or offset is None:
        raise ValueError(f"not a consumed or delivered record: {topic}:{partition}@{offset}")
    return topic, partition, offset


def headers(msg: Message) -> list[Header] | None:
    """A consumed record's headers as the client gives them: (name, value) pairs, or None."""
    return cast("list[Header] | None", msg.headers())


def delivery_count(msg: Message) -> int:
    """How many times a share group has delivered the record (1 the first time)."""
    count = msg.delivery_count()
    if count is None:
        raise ValueError("not a record a share consumer polled")
    return count
