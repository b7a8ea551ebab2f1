"""Which offset is safe to commit when records finish out of order.

Records of a partition are dispatched in offset order but complete in any order (the flow
consumer runs many at once). The committable position is the lowest offset still in flight,
or one past the highest dispatched offset when nothing is: everything below it is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TopicPartition = tuple[str, int]


@dataclass
class _PartitionState:
    in_flight: set[int] = field(default_factory=set)
    next_offset: int | None = None  # one past the highest dispatched offset
    committed: int | None = None


class OffsetTracker:
    """Per-partition in-flight offsets and the highest contiguous completed position."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _PartitionState] = {}

    def dispatched(self, tp: TopicPartition, offset: int) -> None:
        state = self._parts.setdefault(tp, _PartitionState())
        state.in_flight.add(offset)
        state.next_offset = max(state.next_offset or 0, offset + 1)

    def completed(self, tp: TopicPartition, offset: int) -> None:
        state = self._parts.get(tp)
        if state is not None:
            state.in_flight.discard(offset)

    def in_flight(self, tps: set[TopicPartition] | None = None) -> int:
        return sum(len(s.in_flight) for tp, s in self._parts.items() if tps is None or tp in tps)

    def committable(self, tps: set[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Positions that moved since the last `mark_committed`, for the given partitions."""
        result = {}
        for tp, state in self._parts.items():
            if (tps is not None and tp not in tps) or state.next_offset is None:
                continue
            position = min(state.in_flight) if state.in_flight else state.next_offset
            if position != state.committed:
                result[tp] = position
        return result

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None:
        for tp, position in positions.items():
            if tp in self._parts:
                self._parts[tp].committed = position

    def forget(self, tps: set[TopicPartition]) -> None:
        """Drop partitions this member no longer owns."""
        for tp in tps:
            self._parts.pop(tp, None)
