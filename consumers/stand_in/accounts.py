"""Provider accounts: one meter shared by every endpoint that names the account, as providers meter
per organization and model, not per path, and counters per caller (a request's `X-Caller`).

An account's concurrency slots and per-minute budgets (`consumers.stand_in.budgets`) are passed
in the same step as the endpoint's own limits: the endpoint, holding its lock, calls the account's
`Claim.admit`, which takes the account's lock. That is the only nesting, always in that order, so
endpoints sharing an account cannot deadlock; everything else takes one lock alone.

`busy_s` is the integral of the calls in flight over wall time, advanced at every change on the
account's clock: busy_s over a measurement's elapsed seconds is its mean concurrency.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from consumers.stand_in.budgets import Budgets, budget_of, metered
from consumers.stand_in.config import AccountConfig, EndpointConfig
from consumers.stand_in.endpoint import Refusal, over_budget, too_many

ANONYMOUS = "-"  # the caller of a request without X-Caller
REFUSAL_KINDS = ("concurrency", "requests", "tokens")  # Refusal.kind
CALLER_COUNTERS = ("requests", "served", "tokens_input", "tokens_output")  # requests: arrived at the meter


class _Flight:
    """Calls in flight, their peak and their integral over wall time."""

    def __init__(self, now: float) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.busy_s = 0.0
        self._at = now

    def add(self, calls: int, now: float) -> None:
        """`calls` more in flight from `now` (0: only advance the integral to now)."""
        self.busy_s += self.in_flight * (now - self._at)
        self._at = now
        self.in_flight += calls
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def reset(self, now: float) -> None:
        """A measurement starts: the integral from zero, the peak from the calls still in flight."""
        self.add(0, now)
        self.busy_s = 0.0
        self.max_in_flight = self.in_flight

    def snapshot(self, now: float) -> dict[str, Any]:
        self.add(0, now)
        return {"in_flight": self.in_flight, "max_in_flight": self.max_in_flight, "busy_s": self.busy_s}


class _Caller:
    """One caller's calls on an account."""

    def __init__(self, now: float) -> None:
        self.counts = dict.fromkeys(CALLER_COUNTERS, 0)
        self.refused = dict.fromkeys(REFUSAL_KINDS, 0)
        self.flight = _Flight(now)

    def reset(self, now: float) -> None:
        self.counts = dict.fromkeys(CALLER_COUNTERS, 0)
        self.refused = dict.fromkeys(REFUSAL_KINDS, 0)
        self.flight.reset(now)

    def snapshot(self, now: float) -> dict[str, Any]:
        return {**self.counts, "refused": dict(self.refused), **self.flight.snapshot(now)}


@dataclass
class Claim:
    """One call's claim on its account: who calls, the tokens it is charged at admission (the
    output's estimate), and the budgets that took the charge, so a correction after a change of
    budget (or a reset) leaves the new buckets alone: they never took it."""

    account: Account
    caller: str
    input_tokens: int = 0
    output_tokens: int = 0
    charged: Budgets | None = field(default=None, repr=False)

    def admit(self, config: EndpointConfig, refused: Refusal | None, headers: Mapping[str, str],
              scale: float) -> Refusal | None:
        """The endpoint's `Meter`: see `Account.admit`."""
        return self.account.admit(self, config, refused, headers, scale)


class Account:
    """One account's meter (slots and budgets) and its counters, in total and per caller, behind
    one lock. `clock` is injectable so buckets and busy_s can be checked against hand-computed times."""

    def __init__(self, config: AccountConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = config.name
        self._config = config
        self._lock = threading.Lock()
        self._clock = clock
        now = clock()
        self._budgets = Budgets.of(config, now)
        self._flight = _Flight(now)
        self._over_quota = 0
        self._callers: dict[str, _Caller] = {}

    @property
    def config(self) -> AccountConfig:
        with self._lock:
            return self._config

    def claim(self, caller: str = ANONYMOUS, input_tokens: int = 0, output_tokens: int = 0) -> Claim:
        """A call's claim, for its endpoint's `admit` to pass."""
        return Claim(self, caller, input_tokens, output_tokens)

    def admit(self, claim: Claim, config: EndpointConfig, refused: Refusal | None, headers: Mapping[str, str],
              scale: float) -> Refusal | None:
        """Count the call as arrived from its caller; unless its endpoint `refused` it, pass the
        account's budgets and take one of its slots, or refuse it over quota (429s shaped as the
        endpoint's own, with its Retry-After policy). A refused call is counted by kind and
        charged nothing. Headers: the endpoint's x-ratelimit-* with the account's buckets over
        them (what remains for everyone)."""
        with self._lock:
            now = self._clock()
            caller = self._callers.get(claim.caller)
            if caller is None:
                caller = self._callers[claim.caller] = _Caller(now)
            caller.counts["requests"] += 1
            self._budgets.refill(now, scale)
            headers = {**headers, **self._budgets.headers(scale)}
            tokens = metered(self._config.tokens, claim.input_tokens, claim.output_tokens)
            refusal = refused
            if refusal is None:
                refusal = self._over_quota_refusal(config, tokens, headers, scale)
                if refusal is not None:
                    self._over_quota += 1
            if refusal is not None:
                caller.refused[refusal.kind] += 1
                return replace(refusal, headers=headers)
            self._budgets.take(tokens)
            claim.charged = self._budgets
            self._flight.add(1, now)
            caller.flight.add(1, now)
            return None

    def _over_quota_refusal(self, config: EndpointConfig, tokens: int, headers: Mapping[str, str],
                            scale: float) -> Refusal | None:
        short = self._budgets.shortfall(tokens, scale)
        if short is not None:
            return over_budget(config, replace(short, message=f"{short.message} (account {self.name})"),
                               headers)
        if self._config.concurrency is not None and self._flight.in_flight >= self._config.concurrency:
            return too_many(config, scale, headers, f"too many concurrent requests (account {self.name})")
        return None

    def release(self, claim: Claim) -> None:
        """An admitted call ended: its slot back."""
        with self._lock:
            now = self._clock()
            self._flight.add(-1, now)
            self._callers[claim.caller].flight.add(-1, now)

    def served(self, claim: Claim, output_tokens: int) -> None:
        """A 200 answer, with the tokens it took."""
        with self._lock:
            counts = self._callers[claim.caller].counts
            counts["served"] += 1
            counts["tokens_input"] += claim.input_tokens
            counts["tokens_output"] += output_tokens

    def correct(self, claim: Claim, output_tokens: int, scale: float) -> None:
        """Replace the output tokens estimated at admission with the answer's actual ones, in the
        budgets that took the charge only."""
        with self._lock:
            if claim.charged is self._budgets:
                kind = self._config.tokens
                self._budgets.correct(metered(kind, claim.input_tokens, claim.output_tokens),
                                      metered(kind, claim.input_tokens, output_tokens), self._clock(), scale)

    def headers(self, scale: float) -> dict[str, str]:
        """The account's x-ratelimit-* as its budgets stand now (empty when it meters no minute)."""
        with self._lock:
            self._budgets.refill(self._clock(), scale)
            return self._budgets.headers(scale)

    def reconfigure(self, config: AccountConfig) -> None:
        """New limits; a changed budget starts full, as a new quota would."""
        with self._lock:
            if budget_of(config) != budget_of(self._config):
                self._budgets = Budgets.of(config, self._clock())
            self._config = config

    def reset(self) -> None:
        """Zero the counters and fill the budgets (a measurement starts afresh); the calls in
        flight stay, and the peaks restart from them."""
        with self._lock:
            now = self._clock()
            self._budgets = Budgets.of(self._config, now)
            self._flight.reset(now)
            self._over_quota = 0
            for caller in self._callers.values():
                caller.reset(now)

    def snapshot(self) -> dict[str, Any]:
        """The limits, the totals over callers, the account's own concurrency and over_quota (the
        calls its meter refused), and each caller's figures."""
        with self._lock:
            now = self._clock()
            callers = {name: caller.snapshot(now) for name, caller in sorted(self._callers.items())}
            totals = {key: sum(c[key] for c in callers.values()) for key in CALLER_COUNTERS}
            refused = {kind: sum(c["refused"][kind] for c in callers.values()) for kind in REFUSAL_KINDS}
            return {"config": asdict(self._config), **totals, "refused": refused,
                    "over_quota": self._over_quota, **self._flight.snapshot(now), "callers": callers}
