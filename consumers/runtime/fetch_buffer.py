"""An application-side buffer between librdkafka and the workers, with coarse back-pressure.

librdkafka discards what it has fetched for a partition when that partition is paused, and
fetches it again after `resume()`; pausing per message or per poll multiplies the bytes read
from the brokers. This buffer applies back-pressure in two steps instead:

1. hold: when the buffer reaches `high` it stops taking records. librdkafka keeps fetching
   only up to its own bounded queue (`queued.max.messages.kbytes`) and then stops by itself,
   with nothing discarded. A keep-alive `consume()` of at most one record every
   `keepalive_s` keeps the member in its group and serves rebalance callbacks.
2. pause: only if the hold lasts longer than `pause_after_s` are the partitions paused (after
   draining librdkafka's queue into the buffer, so the pause itself discards ~nothing), which
   stops even the keep-alive trickle. They resume once the buffer is down to `low`.
"""

from __future__ import annotations

import time
from collections import deque

from confluent_kafka import Consumer, Message, TopicPartition

from consumers.kafka_clients import records

TP = tuple[str, int]


class FetchBuffer:
    """Per-partition queues of fetched records, served round-robin or by partition."""

    def __init__(self, consumer: Consumer, high: int, low: int | None = None, keepalive_s: float = 1.0,
                 pause_after_s: float = 5.0) -> None:
        self.consumer = consumer
        self.high = high
        self.low = high // 4 if low is None else low
        self.keepalive_s = keepalive_s
        self.pause_after_s = pause_after_s
        self.paused = False
        self.pause_cycles = 0
        self.delivered_bytes = 0  # key + value bytes librdkafka handed over
        self._queues: dict[TP, deque[Message]] = {}
        self._size = 0
        self._last_consume = time.monotonic()
        self._holding_since: float | None = None
        self._held_back: set[TP] = set()  # assigned, but lent to a canary: kept paused

    def __len__(self) -> int:
        return self._size

    def poll(self, timeout_s: float) -> list[Message]:
        """Fetch into the buffer while there is room; return error events for the caller."""
        now = time.monotonic()
        if self.paused:
            errors = self._consume(1000, timeout_s)  # paused partitions deliver nothing
            if self._size <= self.low:
                self.consumer.resume(self._assigned())
                self.paused = False
            return errors
        if self._size < self.high:
            self._holding_since = None
            return self._consume(self.high - self._size, timeout_s)
        self._holding_since = self._holding_since or now
        if now - self._holding_since >= self.pause_after_s:
            return self._pause()
        if now - self._last_consume >= self.keepalive_s:
            return self._consume(1, 0)
        return []

    def _consume(self, count: int, timeout_s: float) -> list[Message]:
        """Up to `count` records. librdkafka's batch consume waits out its whole timeout unless
        the batch fills, which would hold a lone record back by the timeout at a low rate: wait
        for the first record only, then take what else is queued without waiting."""
        self._last_consume = time.monotonic()
        msgs = self.consumer.consume(num_messages=1, timeout=timeout_s)
        if msgs and count > 1:
            msgs += self.consumer.consume(num_messages=count - 1, timeout=0)
        return self._take(msgs)

    def _take(self, msgs: list[Message]) -> list[Message]:
        errors = []
        for msg in msgs:
            if msg.error() is not None:
                errors.append(msg)
                continue
            self.delivered_bytes += len(msg.value() or b"") + len(msg.key() or b"")
            tp = records.place(msg)[:2]
            if tp in self._held_back:  # fetched before its pause: the candidate handles it
                continue
            self._queues.setdefault(tp, deque()).append(msg)
            self._size += 1
        return errors

    def _pause(self) -> list[Message]:
        errors = []
        while drained := self.consumer.consume(num_messages=1000, timeout=0):
            errors += self._take(drained)
        self.consumer.pause(self._assigned())
        self.paused = True
        self.pause_cycles += 1
        self._holding_since = None
        return errors

    def _assigned(self) -> list[TopicPartition]:
        return [tp for tp in self.consumer.assignment() if (tp.topic, tp.partition) not in self._held_back]

    def hold_back(self, tp: TP, pause: bool = True) -> None:
        """Stop fetching `tp` until `go_on`, whatever the buffer's own pauses do (`pause=False`
        while it is not assigned yet: `reassert_pause` pauses it then)."""
        self.drop({tp})
        self._held_back.add(tp)
        if pause:
            self.consumer.pause([TopicPartition(*tp)])

    def go_on(self, tp: TP) -> None:
        """Fetch `tp` again (once the buffer's own pause, if any, is over)."""
        self._held_back.discard(tp)
        if not self.paused:
            self.consumer.resume([TopicPartition(*tp)])

    def reassert_pause(self) -> None:
        """Partitions assigned while paused, or held back, arrive unpaused; pause them too."""
        held = [tp for tp in self.consumer.assignment() if (tp.topic, tp.partition) in self._held_back]
        if self.paused or held:
            self.consumer.pause(self._assigned() + held if self.paused else held)

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
        """Forget the records of partitions this member no longer owns (and that they were held back)."""
        for tp in tps:
            self._size -= len(self._queues.pop(tp, ()))
            self._held_back.discard(tp)

    def clear(self) -> None:
        self.drop(set(self._queues))
