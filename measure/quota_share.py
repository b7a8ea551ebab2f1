"""The figures of a quota several pipelines share, defined once.

A quota's capacity C (its concurrency, or a minute's requests or tokens) is shared by weight:
pipeline i, of weight w_i, is due C * w_i / sum(w) while every pipeline wants more than that.
`used` is what each pipeline took of the same capacity over the same time (calls in flight on
average, requests or tokens in a minute).

- fair share: C * w_i / sum(w), the weighted fair share when every pipeline is backlogged.
- fair allocation: the weighted max-min fair share (water-filling) when some pipelines demand
  less than their fair share: each gets its demand, and what it leaves is shared by weight among
  the others, again and again, until every pipeline has its demand or an equal share of the
  rest. A sharing that gives an idle pipeline's share to the others is fair by it; one that
  holds it back is not.
- share of fair: used_i / the pipeline's fair share (or fair allocation, given the demands): 1
  when it got what it was due, below 1 when others took it, above 1 when it took theirs.
- Jain's index over x_1..x_n: (sum x)^2 / (n * sum x^2); 1 when every x is equal, 1/n when
  one x holds everything. Weighted, over x_i = used_i / w_i: a pipeline of weight 2 is due
  twice, so equal x, not equal use, is fair.
- quota used: the total used / C, the share of the quota spent.

Plain Python, like measure.figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def fair_shares(capacity: float, weights: Mapping[str, float]) -> dict[str, float]:
    """Each pipeline's due when all are backlogged: capacity * w_i / sum(w)."""
    total = _positive(capacity, weights)
    return {name: capacity * weight / total for name, weight in weights.items()}


def fair_allocation(capacity: float, weights: Mapping[str, float],
                    demands: Mapping[str, float]) -> dict[str, float]:
    """The weighted max-min fair share of `capacity` (water-filling): a pipeline demanding less
    than its share gets its demand, and what it leaves goes to the others by weight. A pipeline
    without a demand is backlogged (it takes whatever it is given). What no one demands stays
    unallocated: the sum is the capacity or the total demand, the smaller."""
    _positive(capacity, weights)
    allocation = dict.fromkeys(weights, 0.0)
    left, wanting = capacity, set(weights)
    while wanting:
        total = math.fsum(weights[name] for name in wanting)
        # Everyone demanding no more than its share of what is left now gets its demand: the
        # shares only grow as the others are served.
        served = {name for name in wanting if demands.get(name, math.inf) <= left * weights[name] / total}
        if not served:
            allocation.update({name: left * weights[name] / total for name in wanting})
            break
        for name in served:
            allocation[name] = demands[name]
        left -= math.fsum(demands[name] for name in served)
        wanting -= served
    return allocation


def share_of_fair(used: Mapping[str, float], weights: Mapping[str, float], capacity: float,
                  demands: Mapping[str, float] | None = None) -> dict[str, float]:
    """used_i over what pipeline i was due: its fair share, or given the demands its fair
    allocation. A pipeline due nothing (it demanded nothing) has no ratio and is left out."""
    due = (fair_shares(capacity, weights) if demands is None
           else fair_allocation(capacity, weights, demands))
    return {name: used.get(name, 0.0) / share for name, share in due.items() if share > 0}


def jain_index(xs: Iterable[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when every x is equal, 1/n when one
    holds everything; None for no x or all 0 (nothing was shared)."""
    values = list(xs)
    squares = math.fsum(x * x for x in values)
    return math.fsum(values) ** 2 / (len(values) * squares) if squares > 0 else None


def weighted_jain(used: Mapping[str, float], weights: Mapping[str, float]) -> float | None:
    """Jain's index over x_i = used_i / w_i: 1 when each pipeline used in proportion to its
    weight. The index does not change with the scale of the x, so it equals Jain's index over
    `share_of_fair` without demands; with idle pipelines, take it over `share_of_fair` with
    the demands, which does not count an idle pipeline's low use as unfair."""
    return jain_index(used.get(name, 0.0) / weight for name, weight in weights.items())


def quota_used(used_total: float, capacity: float) -> float:
    """The share of the quota spent: the total used / capacity."""
    if capacity <= 0:
        raise ValueError("a quota's capacity must be positive")
    return used_total / capacity


def _positive(capacity: float, weights: Mapping[str, float]) -> float:
    """sum(w), checking that the capacity and every weight are positive."""
    if capacity <= 0 or not weights or min(weights.values()) <= 0:
        raise ValueError("a quota's capacity and its pipelines' weights must be positive")
    return math.fsum(weights.values())
