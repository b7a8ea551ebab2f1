"""What the permits and the algorithm share: a try's permit, the outcomes it ends with, and the
counts of calls in flight (kept by the permits, read by the algorithm)."""

from __future__ import annotations

import math
from dataclasses import dataclass

OK, OVERLOAD, NOT_SENT = "ok", "http_429", "not_sent"


@dataclass(frozen=True)
class Permit:
    """One try's place in flight: the cut generation it was taken under, when it was taken or,
    once sent, sent; how many permits were held with it when taken (`held`) and, once sent, how
    many calls were sent and not back with it (`level`; both count itself)."""

    generation: int
    at: float
    held: int = 0
    level: int = 0
    sent: bool = False
    stepped: bool = False  # sent past the level a step was taken from: refused, the step pays


@dataclass
class Flight:
    """The calls as the permits count them: the algorithm reads them, only the permits write."""

    held: int = 0  # permits held
    sent: int = 0  # calls sent and not back: what the endpoint may hold of ours
    ended: int = 0  # calls ended so far: refused probes are paced in rounds of the limit's calls
    ended_at: float = -math.inf  # when a call last ended
