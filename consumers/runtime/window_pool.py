"""Records in flight, pooled across the flow members of one fleet.

Each flow member has a window of records in flight; the members of one fleet share the sum
of their windows instead of each keeping to its own. Their AI calls are capped by one limiter
anyway, so a member's own window only bound at the end of a backlog: keys hash unevenly, one
member's partitions hold a few percent more records than the others', and once the others had
run dry it finished alone within its own window, half the fleet's AI calls for the last
second or so of a burst. Pooled, the member still holding records can use every slot the
others have left.

Each member reports its own count (its offset tracker's, which is the truth) whenever it asks,
so a count cannot drift; two members asking at once may together take a few records past the
pool's size, which their next report corrects.
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

    def hold(self, member: str, in_flight: int) -> None:
        """`member` has `in_flight` records out now (0 once it stopped)."""
        with self._lock:
            self._held[member] = in_flight
