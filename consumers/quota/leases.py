"""Each holder's share of a quota, renewed under a lease in PostgreSQL.

A renewal is one transaction under the quota's row lock, so holders on any number of machines
renew one at a time. It drops the claims whose lease and drain are over, writes the renewing
holder's demand and computes its share from every live claim (`allocation.allocate`). A holder
never grows past what the others' grants leave free, and its grant on record never shrinks
below the calls it has out (a lower share stops new calls at once). So the grants sum to at
most the quota while shares move: a share given up is taken only once its holder has recorded
letting it go. A claim whose lease lapsed (its holder was killed, or lost the database) gets no
new share, but its grant still counts until `released_at`, the lease plus the longest its calls
may take, since a provider keeps serving a call whose caller died.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import psycopg2

from consumers.quota.allocation import Claim, allocate, whole

CALLS, REQUESTS, TOKENS = "calls", "requests", "tokens"  # calls at once; a minute's requests, tokens
DIMENSIONS = (CALLS, REQUESTS, TOKENS)


@dataclass(frozen=True)
class Limits:
    """What a quota allows at once and per minute; None where it does not meter."""

    calls: int | None = None
    requests: float | None = None
    tokens: float | None = None

    def of(self, dimension: str) -> float | None:
        return getattr(self, dimension)


@dataclass(frozen=True)
class Holding:
    """One holder's claim as the quota's rows keep it."""

    holder: str
    pipeline: str
    lane: str
    weight: float
    demand: Mapping[str, float]
    granted: Mapping[str, float] = field(default_factory=dict)
    in_use: int = 0  # calls it has out
    live: bool = True  # its lease holds


@dataclass(frozen=True)
class Grant:
    """A renewal's outcome per metered dimension: what the holder may use from now on, and what
    the quota's rows count as its own, which for calls at once includes the calls it still has
    out beyond a lowered share until they end."""

    use: Mapping[str, float]
    held: Mapping[str, float]


def next_grant(limits: Limits, me: Holding, others: Sequence[Holding],
               reserves: Mapping[str, float] | None = None) -> Grant:
    """`me`'s grant of each metered dimension: its share of the live claims, grown only into
    what the others' grants (lapsed ones too) leave free. A lower share applies at once, but
    for calls at once it is held as no lower than the calls still out."""
    use: dict[str, float] = {}
    held: dict[str, float] = {}
    for dimension in DIMENSIONS:
        capacity = limits.of(dimension)
        if capacity is None:
            continue
        claims = [Claim(h.holder, h.pipeline, h.lane, h.weight, h.demand.get(dimension, 0.0))
                  for h in (*[o for o in others if o.live], me)]
        shares = allocate(capacity, claims, reserves)
        if dimension == CALLS:
            shares = dict(whole(shares, int(capacity)))
        target, before = shares[me.holder], me.granted.get(dimension, 0.0)
        free = max(0.0, capacity - sum(o.granted.get(dimension, 0.0) for o in others))
        if target > before:
            use[dimension] = held[dimension] = min(target, free)
        else:
            use[dimension] = target
            held[dimension] = min(before, max(target, float(me.in_use))) if dimension == CALLS else target
    return Grant(use, held)


_LOCK_LIMITS = """
INSERT INTO quota_limits (quota, concurrency, requests_per_minute, tokens_per_minute)
VALUES (%(quota)s, %(calls)s, %(requests)s, %(tokens)s)
ON CONFLICT (quota) DO UPDATE SET concurrency = EXCLUDED.concurrency,
    requests_per_minute = EXCLUDED.requests_per_minute, tokens_per_minute = EXCLUDED.tokens_per_minute,
    updated_at = now()
RETURNING concurrency, requests_per_minute, tokens_per_minute
"""
_DROP_RELEASED = "DELETE FROM quota_claims WHERE quota = %s AND released_at < now()"
_CLAIMS = """
SELECT holder, pipeline, lane, weight, demand_calls, demand_requests, demand_tokens,
       granted_calls, granted_requests, granted_tokens, in_use, expires_at > now()
FROM quota_claims WHERE quota = %s
"""
_RENEW = """
INSERT INTO quota_claims (quota, holder, pipeline, stage, run_id, lane, weight, demand_calls,
    demand_requests, demand_tokens, granted_calls, granted_requests, granted_tokens, in_use,
    renewed_at, expires_at, released_at)
VALUES (%(quota)s, %(holder)s, %(pipeline)s, %(stage)s, %(run_id)s, %(lane)s, %(weight)s,
    %(demand_calls)s, %(demand_requests)s, %(demand_tokens)s, %(granted_calls)s,
    %(granted_requests)s, %(granted_tokens)s, %(in_use)s, now(),
    now() + make_interval(secs => %(lease_s)s),
    now() + make_interval(secs => %(lease_s)s + %(drain_s)s))
ON CONFLICT (quota, holder) DO UPDATE SET lane = EXCLUDED.lane, weight = EXCLUDED.weight,
    demand_calls = EXCLUDED.demand_calls, demand_requests = EXCLUDED.demand_requests,
    demand_tokens = EXCLUDED.demand_tokens, granted_calls = EXCLUDED.granted_calls,
    granted_requests = EXCLUDED.granted_requests, granted_tokens = EXCLUDED.granted_tokens,
    in_use = EXCLUDED.in_use, renewed_at = now(), expires_at = EXCLUDED.expires_at,
    released_at = EXCLUDED.released_at
"""
_HISTORY = """
INSERT INTO quota_history (quota, holder, pipeline, lane, at, demand_calls, granted_calls,
    granted_requests, granted_tokens, in_use)
VALUES (%(quota)s, %(holder)s, %(pipeline)s, %(lane)s, now(), %(demand_calls)s, %(granted_calls)s,
    %(granted_requests)s, %(granted_tokens)s, %(in_use)s)
"""
_RELEASE = "DELETE FROM quota_claims WHERE quota = %s AND holder = %s"


@dataclass(frozen=True)
class Holder:
    """Who renews: one fleet process of one stage of one pipeline's run."""

    quota: str
    holder: str
    pipeline: str
    stage: str
    run_id: str
    lane: str
    weight: float
    lease_s: float  # how long a renewal holds
    drain_s: float  # the longest one of its calls may take: its grant counts that much longer


class LeaseStore:
    """Renewals of quota leases over one connection of its own (a renewal must not wait behind
    the fleet's record writes, nor hold one of their connections)."""

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self._conn: psycopg2.extensions.connection | None = None

    def _connection(self) -> psycopg2.extensions.connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg2.connect(self._url, connect_timeout=5,
                                          options="-c statement_timeout=5000")
        return self._conn

    def renew(self, who: Holder, limits: Limits, demand: Mapping[str, float], in_use: int,
              reserves: Mapping[str, float] | None = None) -> dict[str, float]:
        """Renew `who`'s lease with its demand and calls out; what it may use now (see
        `next_grant`)."""
        conn = self._connection()
        try:
            with conn, conn.cursor() as cur:
                cur.execute(_LOCK_LIMITS, {"quota": who.quota, "calls": limits.calls,
                                           "requests": limits.requests, "tokens": limits.tokens})
                calls, requests, tokens = cur.fetchone()
                in_force = Limits(calls, requests, tokens)
                cur.execute(_DROP_RELEASED, (who.quota,))
                cur.execute(_CLAIMS, (who.quota,))
                rows = [_holding(row) for row in cur.fetchall()]
                mine = next((h for h in rows if h.holder == who.holder), None)
                me = Holding(who.holder, who.pipeline, who.lane, who.weight, demand,
                             mine.granted if mine else {}, in_use)
                grant = next_grant(in_force, me, [h for h in rows if h.holder != who.holder], reserves)
                params: dict[str, object] = {
                    "quota": who.quota, "holder": who.holder, "pipeline": who.pipeline,
                    "stage": who.stage, "run_id": who.run_id, "lane": who.lane, "weight": who.weight,
                    "in_use": in_use, "lease_s": who.lease_s, "drain_s": who.drain_s,
                    **{f"demand_{d}": demand.get(d, 0.0) for d in DIMENSIONS},
                    **{f"granted_{d}": grant.held.get(d, 0.0) for d in DIMENSIONS},
                    "granted_calls": int(grant.held.get(CALLS, 0.0))}
                cur.execute(_RENEW, params)
                cur.execute(_HISTORY, params)
        except psycopg2.Error:
            conn.close()
            raise
        return dict(grant.use)

    def release(self, who: Holder) -> None:
        """Give the share back at once: a fleet stopping cleanly has no call out any more."""
        conn = self._connection()
        with conn, conn.cursor() as cur:
            cur.execute(_RELEASE, (who.quota, who.holder))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _holding(row: Sequence) -> Holding:
    holder, pipeline, lane, weight, *numbers, in_use, live = row
    demand = dict(zip(DIMENSIONS, numbers[:3], strict=True))
    granted = dict(zip(DIMENSIONS, numbers[3:], strict=True))
    return Holding(holder, pipeline, lane, weight, demand, granted, in_use, live)
