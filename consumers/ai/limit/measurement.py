"""What an adaptive limit learns time from: the latencies of served calls and the round trips of
refused ones. Latencies are heavy-tailed, so only medians over whole windows speak of the service
(a mean follows the tail), and a window's median is compared with the baseline only past what its
own spread explains; a refusal's round trip is how long a probe's refusal may take to come back,
so the limiter waits that long before it takes silence for admission."""

from __future__ import annotations

import math
import statistics
from collections import deque

from consumers.ai.limit.settings import LimitSettings


class Latencies:
    """The latencies of served calls: the median of the last `median_of` (the time unit of
    every wait; a mean would follow the tail), and the medians of whole windows of them, whose
    lowest of the last `baseline_medians` is the baseline a queueing service is measured
    against."""

    def __init__(self, settings: LimitSettings) -> None:
        self.settings = settings
        self.recent: deque[float] = deque(maxlen=settings.median_of)
        self.medians: deque[float] = deque(maxlen=settings.baseline_medians)
        self._noise = 1.0  # the factor a window median spreads by: exp(noise_errors x its error)
        self._fresh = 0  # latencies since the last window median
        self._windows = 0

    def add(self, latency: float) -> bool:
        """Note a latency; True when it closes a window that counts. Calls end shortest first:
        the first window after a burst starts takes the fast ones of many and the slow ones of
        few, so it is no baseline."""
        self.recent.append(latency)
        self._fresh += 1
        if self._fresh < self.settings.median_of:
            return False
        self._fresh, self._windows = 0, self._windows + 1
        if self._windows == 1:
            return False
        self.medians.append(self.median())
        self._noise = math.exp(self.settings.noise_errors * median_error(self.recent))
        return True

    def median(self) -> float:
        return statistics.median(self.recent) if self.recent else 0.0

    def queued(self, tolerance: float) -> bool:
        """The last two window medians both over `tolerance` times the baseline (one alone is
        no queue)."""
        if len(self.medians) <= 2:
            return False
        return min(self.medians[-1], self.medians[-2]) > tolerance * self._noise * min(self.medians)

    def slowed(self) -> bool:
        """The last window median over `growth_tolerance` of the baseline: no growth meanwhile."""
        return bool(self.medians) and (self.medians[-1]
                                       > self.settings.growth_tolerance * self._noise * min(self.medians))


def median_error(latencies: deque[float]) -> float:
    """The standard error of the median of `latencies` in log terms (a lognormal's: 1.25 times its
    spread over the square root of their number), the spread read from the quartiles: a heavy
    tail's window medians spread so far that the lowest of ten is half of what is typical, which
    a fixed tolerance would take for a queue."""
    if len(latencies) < 4 or min(latencies) <= 0:
        return 0.0
    low, _, high = statistics.quantiles(latencies, n=4)
    return 1.2533 * math.log(high / low) / 1.349 / math.sqrt(len(latencies))


class RoundTrips:
    """How long a 429 takes to come back: a running mean, and the recent ones."""

    def __init__(self, settings: LimitSettings) -> None:
        self.weight = settings.trip_weight
        self.mean: float | None = None
        self._recent: deque[float] = deque(maxlen=settings.recent_trips)

    def add(self, trip: float) -> None:
        self.mean = trip if self.mean is None else self.mean + self.weight * (trip - self.mean)
        self._recent.append(trip)

    def longest(self) -> float:
        return max(self._recent)
