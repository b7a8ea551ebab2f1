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


@dataclass
class PausingConsumer(BatchConsumer):
    """Assigned partitions 0-2 of `requests`; records which it was told to pause and resume."""

    paused: set[int] = field(default_factory=set)

    def assignment(self) -> list:
        from confluent_kafka import TopicPartition

        return [TopicPartition("requests", p) for p in range(3)]

    def pause(self, partitions: list) -> None:
        self.paused |= {tp.partition for tp in partitions}

    def resume(self, partitions: list) -> None:
        self.paused -= {tp.partition for tp in partitions}


def test_a_partition_held_back_is_paused_its_records_dropped_and_never_taken() -> None:
    consumer = PausingConsumer([Record(0, 1), Record(1, 2)])
    buffer = FetchBuffer(consumer, high=100)
    buffer.poll(0.05)
    buffer.hold_back(("requests", 1))
    assert consumer.paused == {1} and len(buffer) == 1  # partition 1's record dropped
    consumer.queued = [Record(1, 3), Record(2, 4)]  # fetched before the pause took effect
    buffer.poll(0.05)
    assert sorted(r.offset() for r in (buffer.pop(), buffer.pop())) == [1, 4] and buffer.pop() is None


def test_the_buffers_own_resume_leaves_a_held_back_partition_paused() -> None:
    consumer = PausingConsumer([Record(p % 2, p) for p in range(8)])
    buffer = FetchBuffer(consumer, high=4, low=1, pause_after_s=0.0)
    buffer.hold_back(("requests", 2))
    buffer.poll(0.0)  # fills to `high`
    buffer.poll(0.0)  # the hold outlasts pause_after_s: every partition paused
    assert buffer.paused and consumer.paused == {0, 1, 2}
    while buffer.pop() is not None:
        pass
    buffer.poll(0.0)  # down to `low`: resumed, but not the held-back partition
    assert not buffer.paused and consumer.paused == {2}
    buffer.go_on(("requests", 2))
    assert consumer.paused == set()


def test_a_partition_let_go_on_while_the_buffer_is_paused_waits_for_its_resume() -> None:
    consumer = PausingConsumer()
    buffer = FetchBuffer(consumer, high=4)
    buffer.hold_back(("requests", 0))
    buffer.paused = True
    buffer.go_on(("requests", 0))
    assert consumer.paused == {0}  # the buffer's resume will take it
