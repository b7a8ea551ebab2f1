"""An application-side buffer between librdkafka and the workers, with coarse back-pressure.

librdkafka discards what it has already fetched for a partition when that partition is paused
and fetches it again after `resume()`, so pausing per message (or per poll) multiplies the
bytes read from the brokers. This buffer pauses rarely and cheaply:

- records are taken from librdkafka into per-partition queues as soon as they arrive;
- only when the buffer reaches `high` does it pause, and first it drains whatever librdkafka
  already holds into the buffer, so the pause discards (almost) nothing;
- it resumes once the buffer is down to `low` (hysteresis), and keeps polling while paused so
  the member stays in its group.
"""

from __future__ import annotations

from collections import deque

from confluent_kafka import Consumer, Message, TopicPartition

TP = tuple[str, int]


class FetchBuffer:
    """Per-partition queues of fetched records, served round-robin or by partition."""

    def __init__(self, consumer: Consumer, high: int, low: int | None = None) -> None:
        self.consumer = consumer
        self.high = high
        self.low = high // 4 if low is None else low
        self.paused = False
        self.pause_cycles = 0
        self.delivered_bytes = 0  # key + value bytes librdkafka handed over
        self._queues: dict[TP, deque[Message]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def poll(self, timeout_s: float) -> list[Message]:
        """Fetch into the buffer (nothing new while paused); return error events for the caller."""
        room = max(1, self.high - self._size)
        errors = self._take(self.consumer.consume(num_messages=room, timeout=timeout_s))
        if not self.paused and self._size >= self.high:
            errors += self._pause()
        elif self.paused and self._size <= self.low:
            self.consumer.resume(self._assigned())
            self.paused = False
        return errors

    def _take(self, msgs: list[Message]) -> list[Message]:
        errors = []
        for msg in msgs:
            if msg.error() is not None:
                errors.append(msg)
                continue
            self.delivered_bytes += len(msg.value() or b"") + len(msg.key() or b"")
            self._queues.setdefault((msg.topic(), msg.partition()), deque()).append(msg)
            self._size += 1
        return errors

    def _pause(self) -> list[Message]:
        errors = []
        while drained := self.consumer.consume(num_messages=1000, timeout=0):
            errors += self._take(drained)
        self.consumer.pause(self._assigned())
        self.paused = True
        self.pause_cycles += 1
        return errors

    def _assigned(self) -> list[TopicPartition]:
        return self.consumer.assignment()

    def reassert_pause(self) -> None:
        """Partitions assigned while paused arrive unpaused; pause them too."""
        if self.paused:
            self.consumer.pause(self._assigned())

    def pop(self) -> Message | None:
        """The oldest record of the next non-empty partition (round-robin across partitions)."""
        for tp in list(self._queues):
            queue = self._queues.pop(tp)
            if queue:
                msg = queue.popleft()
                self._size -= 1
                if queue:
                    self._queues[tp] = queue  # re-inserted at the end: next partition goes first
                return msg
        return None

    def pop_from(self, tp: TP) -> Message | None:
        queue = self._queues.get(tp)
        if not queue:
            return None
        self._size -= 1
        return queue.popleft()

    def drop(self, tps: set[TP]) -> None:
        """Forget the records of partitions this member no longer owns."""
        for tp in tps:
            self._size -= len(self._queues.pop(tp, ()))

    def clear(self) -> None:
        self.drop(set(self._queues))
