"""How one quota's capacity is divided among the holders that claim it.

Lanes are served in strict priority (interactive, then standard, then batch), except what a
lane reserves: a reservation is the lane's before any other lane is served, up to what it asks
for, so batch work keeps moving under an interactive burst when the quota says so. Inside a
lane, pipelines get weighted max-min fair shares (a pipeline that asks for less than its share
gets what it asks for, and the rest goes to the others by their weights); inside a pipeline,
its holders (one per fleet process) share equally the same way. What nobody asks for stays
unallocated: a holder's demand already carries its headroom (`consumers.quota.holder`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from measure.quota_share import fair_allocation

LANES = ("interactive", "standard", "batch")  # strict priority, highest first


@dataclass(frozen=True)
class Claim:
    """What one holder asks of one dimension of a quota (calls at once, or a minute's
    requests or tokens)."""

    holder: str
    pipeline: str
    lane: str
    weight: float  # its pipeline's, > 0
    demand: float


def _fill(capacity: float, weights: Mapping[str, float], demands: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min fair shares of `capacity` (`measure.quota_share.fair_allocation`, the
    figure the benchmark holds the sharing to); none of nothing."""
    if capacity <= 0 or not weights:
        return dict.fromkeys(weights, 0.0)
    return fair_allocation(capacity, weights, demands)


def allocate(capacity: float, claims: Sequence[Claim],
             reserves: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each holder's share of `capacity`: lanes by priority after their reservations (shares of
    the capacity), pipelines by weight inside a lane, holders equally inside a pipeline."""
    reserves = reserves or {}
    in_lane = {lane: [c for c in claims if c.lane == lane] for lane in LANES}
    wanted = {lane: sum(c.demand for c in lane_claims) for lane, lane_claims in in_lane.items()}
    lane_total = {lane: min(wanted[lane], capacity * reserves.get(lane, 0.0)) for lane in LANES}
    left = capacity - sum(lane_total.values())
    for lane in LANES:
        extra = max(0.0, min(wanted[lane] - lane_total[lane], left))
        lane_total[lane] += extra
        left -= extra
    shares: dict[str, float] = {}
    for lane, lane_claims in in_lane.items():
        pipelines = {c.pipeline: c.weight for c in lane_claims}
        asked = {p: sum(c.demand for c in lane_claims if c.pipeline == p) for p in pipelines}
        for pipeline, share in _fill(lane_total[lane], pipelines, asked).items():
            holders = [c for c in lane_claims if c.pipeline == pipeline]
            equal = {c.holder: 1.0 for c in holders}
            shares.update(_fill(share, equal, {c.holder: c.demand for c in holders}))
    return shares


def whole(shares: Mapping[str, float], capacity: int) -> dict[str, int]:
    """Shares of calls at once as whole calls: each share rounded down, then the calls that
    leaves of `capacity` handed out by the largest remainders (ties by holder, so every holder
    computes the same split), never beyond a share's next whole number."""
    floors = {name: math.floor(share + 1e-9) for name, share in shares.items()}
    spare = capacity - sum(floors.values())
    by_remainder = sorted(shares, key=lambda name: (-(shares[name] - floors[name]), name))
    for name in by_remainder:
        if spare <= 0:
            break
        if shares[name] - floors[name] > 1e-9:
            floors[name] += 1
            spare -= 1
    return floors
