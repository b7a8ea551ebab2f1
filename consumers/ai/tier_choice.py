"""Which tier answers a record: the cheapest whose expected turnaround leaves its deadline met
with a realtime call's time kept in hand.

Why keep that time in hand: a tier that answers later may not answer at all (a batch expires or
fails, a flex call is refused for want of capacity), and the record then falls back to a
realtime call that must still end before the deadline. So a tier fits a record when its
expected turnaround plus the realtime call's time fits in what the record has left, and a record
the tier has not answered by `fallback_at` is called realtime. Realtime always fits: a record
already too late for it is best served at once.

A tier's turnaround is learned from its own history (`Turnaround`): the 95th percentile of its
recent completions, the declared window until enough of them are in."""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from measure.cost import Prices

REALTIME, FLEX, BATCH = "realtime", "flex", "batch"
QUANTILE = 95  # percentile of the recent turnarounds a tier is expected within
SAMPLES = 50  # recent completions (a batch's, a flex call's) the percentile is taken over
MIN_SAMPLES = 5  # below these the declared window holds


@dataclass(frozen=True)
class Offer:
    """A tier as the router weighs it: its price and its expected turnaround (seconds)."""

    tier: str
    prices: Prices
    turnaround_s: float


def choose(offers: Sequence[Offer], tokens: tuple[float, float], time_left_s: float | None,
           realtime_s: float) -> str:
    """The tier for one record: the cheapest of its `tokens` (input, expected output) among the
    offers that fit `time_left_s` before its deadline (None: no deadline, realtime) with
    `realtime_s` kept for a fallback; realtime, which is always among the offers, on a tie."""
    if not any(o.tier == REALTIME for o in offers):
        raise ValueError("realtime is always offered: it is what every other tier falls back to")
    if time_left_s is None:
        return REALTIME
    fitting = [o for o in offers if o.tier == REALTIME or o.turnaround_s + realtime_s <= time_left_s]
    return min(fitting, key=lambda o: (o.prices.of(*tokens), o.tier != REALTIME)).tier


def fallback_at(deadline_at: float, realtime_s: float) -> float:
    """When a record a later tier has not answered is called realtime instead (epoch seconds)."""
    return deadline_at - realtime_s


class Turnaround:
    """One tier's expected turnaround, shared by the router and the keeper of a fleet
    (thread-safe); its history is the tier's recent completions in the database, so every
    process of a stage learns from every batch."""

    def __init__(self, declared_s: float) -> None:
        if not declared_s > 0:
            raise ValueError(f"a declared turnaround is positive, got {declared_s}")
        self.declared_s = declared_s
        self._lock = threading.Lock()
        self._seen: deque[float] = deque(maxlen=SAMPLES)

    def learned(self, recent: Sequence[float]) -> None:
        """The seconds the tier's recent batches (or flex calls) took to answer, oldest first."""
        with self._lock:
            self._seen = deque(recent[-SAMPLES:], maxlen=SAMPLES)

    def add(self, seconds: float) -> None:
        """One more completion (a flex call's, as the process that made it sees it)."""
        with self._lock:
            self._seen.append(seconds)

    def expected_s(self) -> float:
        """The seconds a record sent to the tier now is expected to wait at most."""
        with self._lock:
            if len(self._seen) < MIN_SAMPLES:
                return self.declared_s
            return statistics.quantiles(self._seen, n=100, method="inclusive")[QUANTILE - 1]
