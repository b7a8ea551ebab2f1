"""The fetch buffer against a consumer that consumes in batches as librdkafka does: a batch
call returns early only once it has the whole batch, otherwise when its timeout runs out."""

from __future__ import annotations

from dataclasses import dataclass, field

from consumers.runtime.fetch_buffer import FetchBuffer


@dataclass
class Record:
    at_partition: int
    at_offset: int

    def partition(self) -> int:
        return self.at_partition

    def offset(self) -> int:
        return self.at_offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "requests"

    def value(self) -> bytes:
        return b"{}"

    def key(self) -> bytes:
        return b"k"


@dataclass
class BatchConsumer:
    queued: list[Record] = field(default_factory=list)
    waited_s: float = 0.0  # what the calls would have blocked for

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Record]:
        batch, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        if len(batch) < num_messages:
            self.waited_s += timeout
        return batch


def test_a_lone_record_is_taken_without_waiting_out_the_timeout() -> None:
    consumer = BatchConsumer([Record(0, 7)])
    buffer = FetchBuffer(consumer, high=100)
    assert buffer.poll(0.05) == []
    assert len(buffer) == 1 and consumer.waited_s == 0.0
    assert buffer.pop().offset() == 7


def test_what_is_queued_is_taken_up_to_the_room_left() -> None:
    consumer = BatchConsumer([Record(p % 3, p) for p in range(10)])
    buffer = FetchBuffer(consumer, high=6)
    buffer.poll(0.05)
    assert len(buffer) == 6 and len(consumer.queued) == 4
    # Round-robin across partitions 0, 1, 2: offsets 0, 1, 2, then 3, 4, 5.
    assert [buffer.pop().offset() for _ in range(6)] == [0, 1, 2, 3, 4, 5]


def test_with_nothing_queued_the_poll_waits_its_timeout_once() -> None:
    consumer = BatchConsumer()
    buffer = FetchBuffer(consumer, high=100)
    buffer.poll(0.05)
    assert len(buffer) == 0 and consumer.waited_s == 0.05
