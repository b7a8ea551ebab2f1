"""Which offset is safe to commit when records finish out of order.

Records of a partition are dispatched in offset order but complete in any order (the flow
consumer runs many at once). The committable position is the lowest offset still in flight
or given back unhandled, or one past the highest dispatched offset when there is none:
everything below it is done.

Each assignment of a partition gets a new epoch, and a dispatched record carries the epoch
it was dispatched under. When a partition is lost (not revoked) its workers may still be
running; if it comes back, a late completion of the first copy of offset N must not be taken
for the new copy of N, or the commit could pass a record still being processed. Completions
from an earlier epoch are therefore ignored.

A member's poll loop changes the bookkeeping (assignments, dispatches, completions, commits)
while its workers ask whether their record is still theirs (`owns`): every method holds the
tracker's lock, so no reading meets a change half made (a partition's state replaced between
reading its epoch and its release, a dict iterated while a partition is assigned).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]


@dataclass
class _PartitionState:
    epoch: int
    in_flight: set[int] = field(default_factory=set)
    unhandled: set[int] = field(default_factory=set)  # given back unhandled: never committed past
    next_offset: int | None = None  # one past the highest dispatched offset
    committed: int | None = None
    releasing: bool = False


class OffsetTracker:
    """Per-partition in-flight offsets, assignment epochs and the committable position;
    thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[TopicPartition, _PartitionState] = {}
        self._epochs = itertools.count(1)  # never reused, across partitions and reassignments

    def assigned(self, tp: TopicPartition) -> int:
        """A (re)assignment of `tp`: fresh bookkeeping under a new epoch."""
        with self._lock:
            state = _PartitionState(next(self._epochs))
            self._parts[tp] = state
            return state.epoch

    def dispatched(self, tp: TopicPartition, offset: int) -> int:
        """Record `offset` as in flight; the epoch its completion must carry."""
        with self._lock:
            state = self._parts.get(tp) or self._parts.setdefault(tp, _PartitionState(next(self._epochs)))
            state.in_flight.add(offset)
            state.next_offset = max(state.next_offset or 0, offset + 1)
            return state.epoch

    def owns(self, tp: TopicPartition, epoch: int) -> bool:
        """True while the record dispatched under `epoch` should still be worked on."""
        with self._lock:
            state = self._parts.get(tp)
            return state is not None and state.epoch == epoch and not state.releasing

    def completed(self, tp: TopicPartition, offset: int, epoch: int, handled: bool = True) -> bool:
        """A worker is done with `offset`: handled, or given back unhandled. False when stale."""
        with self._lock:
            state = self._parts.get(tp)
            if state is None or state.epoch != epoch:
                return False
            state.in_flight.discard(offset)
            if not handled:
                state.unhandled.add(offset)
            return True

    def in_flight(self, tps: set[TopicPartition] | None = None) -> int:
        with self._lock:
            return sum(len(s.in_flight) for tp, s in self._parts.items() if tps is None or tp in tps)

    def committable(self, tps: set[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Positions that moved since the last `mark_committed`, for the given partitions."""
        result = {}
        with self._lock:
            for tp, state in self._parts.items():
                if (tps is not None and tp not in tps) or state.next_offset is None:
                    continue
                pending = state.in_flight | state.unhandled
                position = min(pending) if pending else state.next_offset
                if position != state.committed:
                    result[tp] = position
        return result

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None:
        with self._lock:
            for tp, position in positions.items():
                if tp in self._parts:
                    self._parts[tp].committed = position

    def releasing(self, tps: set[TopicPartition]) -> None:
        """The partitions are being handed back: their workers stop retrying (`owns` is False)."""
        with self._lock:
            for tp in tps:
                if tp in self._parts:
                    self._parts[tp].releasing = True

    def forget(self, tps: set[TopicPartition]) -> None:
        """Drop partitions this member no longer owns; their late completions become stale."""
        with self._lock:
            for tp in tps:
                self._parts.pop(tp, None)
