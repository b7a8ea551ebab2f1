"""Records in flight, pooled across the flow members of one fleet.

Each flow member has a window of records in flight; the members of one fleet share the sum
of their windows instead of each keeping to its own. Their AI calls are capped by one limiter
anyway, so a member's own window only bound at the end of a backlog: keys hash unevenly, one
member's partitions hold a few percent more records than the others', and once the others had
run dry it finished alone within its own window, half the fleet's AI calls for the last
second or so of a burst. Pooled, the member still holding records can use every slot the
others have left.

Each member reports its own count (its offset tracker's, which is the truth) whenever it asks,
so a count cannot drift. What a member takes is held for it at once, before it starts the
records: two members asking together then never start more than the pool's size between them
(they did on a loaded machine when asking only read the room left).
"""

from __future__ import annotations

import threading


class WindowPool:
    """The fleet's records in flight; thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def free(self, member: str, in_flight: int) -> int:
        """Records `member`, with `in_flight` of its own out, may start now."""
        with self._lock:
            self._held[member] = in_flight
            return max(0, self.size - sum(self._held.values()))

    def take(self, member: str, in_flight: int, wanted: int) -> int:
        """Up to `wanted` records `member`, with `in_flight` of its own out, starts now: held for
        it until its next report (`hold` gives back what it did not start)."""
        with self._lock:
            self._held[member] = in_flight
            granted = max(0, min(wanted, self.size - sum(self._held.values())))
            self._held[member] = in_flight + granted
            return granted

    def hold(self, member: str, in_flight: int) -> None:
        """`member` has `in_flight` records out now (0 once it stopped)."""
        with self._lock:
            self._held[member] = in_flight
