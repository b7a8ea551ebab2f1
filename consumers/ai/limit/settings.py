"""The adaptive limit's tunables, one documented setting each.

Waits are counted in latencies (the median of the recent served calls) or in rounds: as many
calls ended as the limit, a mean latency whatever the tail. A refused probe past the ceiling is
one 429, so paced in rounds it is a share of the calls no tail can raise.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LimitSettings:
    """How the limit probes, cuts and waits (docs/adaptive.md says why each is what it is)."""

    median_of: int = 64
    """Served calls' latencies per median (the time unit of every wait, and a window of the
    medians compared): over fewer, a heavy tail moves a median by tens of percent."""
    baseline_medians: int = 10
    """Window medians the baseline is the lowest of: it follows a service that slowed."""
    noise_errors: float = 3.0
    """Standard errors of a window's median that its comparisons with the baseline allow on top."""
    latency_tolerance: float = 2.0
    """Two window medians running over this many times the baseline: the service queues."""
    growth_tolerance: float = 1.5
    """A window median this far over the baseline: the service slowed, so no growth meanwhile."""
    trip_weight: float = 0.2
    """Each 429's weight in the running mean of their round trips."""
    recent_trips: int = 16
    """429 round trips whose longest a probe waits out too."""
    probe_every: float = 3.0
    """Latencies between probes under the level to regain, at most."""
    probe_every_s: float = 1.5
    """Seconds between those probes, at most, unless `lasted_share` of the shrink is longer: a
    limit that came back is found within them."""
    lasted_share: float = 1 / 8
    """The share of the time the shrink has lasted those probes may wait instead: a shrink that
    has lasted may well last."""
    first_probe_wait: float = 0.25
    """Latencies before the probe after a first refused one under the level to regain."""
    ceiling_every: float = 6.0
    """Rounds between probes past the ceiling, once refused there time after time."""
    ceiling_every_s: float = 30.0
    """Seconds between probes past the ceiling, at most: a service that grew is found within
    them."""
    ceiling_first_wait: float = 4.0
    """Rounds before the probe after a first refused one at the ceiling."""
    step_share: float = 1 / 16
    """The largest step of a probe, as a share of the limit: what one may cost."""
    backoff: float = 0.5
    """The cut when the service shrank or queues."""
    admit_trips: int = 4
    """A probe out this many 429 round trips unrefused was admitted."""
    admit_share: float = 0.05
    """Until a 429 has measured the round trip, a probe out this share of the latency unrefused
    was admitted, ..."""
    first_trip_s: float = 0.1
    """... and no less than a hosted API's round trip (a loaded machine's too)."""
    first_step: float = 2.0
    """The largest step until a 429 has measured the round trip: a first refusal late by R
    finds the limit at most 2R / `first_trip_s` past the service."""
    shrink_refusals: int = 2
    """Refusals after an episode's first, far under what was answered: the service shrank."""
    transit_spread: float = 2.0
    """The calls on their way back, at the most, against their mean."""
    stall_ends: int = 8
    """Calls' share of the latency without one ending: stalled, no probe admitted."""
