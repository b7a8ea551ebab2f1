"""One endpoint's state behind one lock: its counters, concurrency slots, rate-limit and budget
buckets, and the random draws of latencies and faults; a call passes its account's meter
(`consumers.stand_in.accounts`) in the same step."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from consumers.stand_in.budgets import Budgets, Shortfall, budget_of, metered
from consumers.stand_in.config import EndpointConfig, matches

# The requests answered 429: too many at once, the request-rate limit, a minute's requests or tokens.
REFUSALS = ("rejected_429", "rate_limited", "rate_limited_requests", "rate_limited_tokens")
COUNTERS = ("served", *REFUSALS, "errors_5xx", "hangs", "unauthorized", "bad_requests",
            "flex_served", "flex_refused")  # request outcomes
TOKEN_COUNTERS = ("tokens_input", "tokens_output")  # actual tokens of served answers


def sample_latency(config: EndpointConfig, rng: random.Random) -> float:
    """One real-scale latency drawn from the endpoint's distribution (lognormal: latency is the median)."""
    if config.distribution == "uniform":
        return max(0.0, config.latency_s * rng.uniform(1 - config.jitter, 1 + config.jitter))
    if config.distribution == "lognormal":
        return config.latency_s * rng.lognormvariate(0.0, config.sigma)
    return config.latency_s


@dataclass(frozen=True)
class Refusal:
    """A request turned away with 429: which counter it went to and when to come back."""

    counter: str  # rejected_429 | rate_limited (rate_limit_rps) | rate_limited_requests | rate_limited_tokens
    retry_after_s: float | None  # wall-clock seconds; None: no Retry-After header
    message: str = field(default="", compare=False)
    headers: Mapping[str, str] = field(default_factory=dict, compare=False)  # the budgets' x-ratelimit-*

    @property
    def kind(self) -> str:
        """The error type the 429 names: concurrency, requests or tokens."""
        return {"rejected_429": "concurrency", "rate_limited_tokens": "tokens"}.get(self.counter, "requests")


def over_budget(config: EndpointConfig, short: Shortfall, headers: Mapping[str, str]) -> Refusal:
    """A per-minute budget's 429, with the endpoint's Retry-After policy."""
    wait = short.wait_s if config.retry_after_on_budget else None
    return Refusal(f"rate_limited_{short.kind}", wait, short.message, headers)


def too_many(config: EndpointConfig, scale: float, headers: Mapping[str, str],
             message: str = "too many concurrent requests") -> Refusal:
    """No free concurrency slot: come back after the endpoint's Retry-After."""
    return Refusal("rejected_429", config.retry_after * scale, message, headers)


class Meter(Protocol):
    """A meter beyond the endpoint's own that a call passes in the same step: its account's."""

    def admit(self, config: EndpointConfig, refused: Refusal | None, headers: Mapping[str, str],
              scale: float) -> Refusal | None:
        """Called under the endpoint's lock, so it must never take that lock: count the call and,
        unless the endpoint `refused` it, pass it or refuse it (charging nothing then); the
        refusal answered, or None. `headers`: the endpoint's budgets' x-ratelimit-*."""
        ...


class SimulatedEndpoint:
    """Counters, concurrency slots, rate-limit buckets and RNG of one endpoint, behind one lock.

    `clock` is injectable so the buckets can be checked against hand-computed times.
    """

    def __init__(self, name: str, config: EndpointConfig, seed: int | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._config = config
        self._lock = threading.Lock()
        self._rng = random.Random(f"{seed}:{name}") if seed is not None else random.Random()
        self._counts = dict.fromkeys(COUNTERS + TOKEN_COUNTERS, 0)
        self._served: Counter[str] = Counter()  # 200s per request identity
        self._in_flight = 0
        self._max_in_flight = 0
        self._clock = clock
        self._applied_at = clock()  # when the config in force was applied (its schedule's zero)
        self._fill_rate_limit(config)
        self._fill_budgets(config)

    @property
    def config(self) -> EndpointConfig:
        with self._lock:
            return self._config

    def reconfigure(self, config: EndpointConfig) -> None:
        """A new config; a changed rate limit or budget starts from a full bucket, as a new quota would."""
        with self._lock:
            if (config.rate_limit_rps, config.rate_burst) != (self._config.rate_limit_rps,
                                                              self._config.rate_burst):
                self._fill_rate_limit(config)
            if config.limit_schedule != self._config.limit_schedule:
                self._applied_at = self._clock()
            if budget_of(config) != budget_of(self._config):
                self._fill_budgets(config)
            self._config = config

    def _fill_rate_limit(self, config: EndpointConfig) -> None:
        self._tokens, self._refilled_at = float(config.rate_burst), self._clock()

    def _fill_budgets(self, config: EndpointConfig) -> None:
        self._budgets = Budgets.of(config, self._clock())

    def count(self, counter: str) -> None:
        with self._lock:
            self._counts[counter] += 1

    def served(self, identity: str | None, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """A 200 answer: counted in total and per identity (when the endpoint's requests have one),
        with the tokens it took."""
        with self._lock:
            self._counts["served"] += 1
            self._counts["tokens_input"] += input_tokens
            self._counts["tokens_output"] += output_tokens
            if identity is not None:
                self._served[identity] += 1

    def admit(self, scale: float, input_tokens: int = 0, output_tokens: int = 0,
              meter: Meter | None = None) -> EndpointConfig | Refusal:
        """Pass the budgets, the rate limit and take a concurrency slot, then the `meter` (the
        account's), returning the config in force, or count a 429 and say when to retry (atomic).
        Budgets and the rate limit are checked first, as an API gateway meters requests before
        they reach the model servers; the token budget charges the request's estimated tokens
        (`output_tokens` is its estimate). A refused request takes nothing from any bucket."""
        with self._lock:
            config = self._config
            now = self._clock()
            tokens = metered(config.tokens, input_tokens, output_tokens)
            refusal = self._refusal(config, now, scale, tokens)
            if meter is not None:
                refusal = meter.admit(config, refusal, self._budgets.headers(scale), scale)
            if refusal is not None:
                self._counts[refusal.counter] += 1
                return refusal
            if config.rate_limit_rps is not None:
                self._tokens -= 1
            self._budgets.take(tokens)
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            return config

    def _refusal(self, config: EndpointConfig, now: float, scale: float, tokens: int) -> Refusal | None:
        """The endpoint's own limit that turns a call away, if any: the buckets refilled, nothing
        charged."""
        self._budgets.refill(now, scale)
        short = self._budgets.shortfall(tokens, scale)
        if short is not None:
            return over_budget(config, short, self._budgets.headers(scale))
        if config.rate_limit_rps is not None:
            rate = config.rate_limit_rps / scale  # tokens per wall-clock second
            self._tokens = min(config.rate_burst, self._tokens + (now - self._refilled_at) * rate)
            self._refilled_at = now
            if self._tokens < 1:
                return Refusal("rate_limited", (1 - self._tokens) / rate, "request rate limit reached",
                               self._budgets.headers(scale))
        if self._in_flight >= config.limit_at((now - self._applied_at) / scale):
            return too_many(config, scale, self._budgets.headers(scale))
        return None

    def release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def correct(self, admitted: EndpointConfig, input_tokens: int, estimate: int, actual: int,
                scale: float) -> None:
        """Replace the output tokens estimated at admission with the answer's actual ones (unless
        the budget was changed meanwhile: a new budget never took the charge)."""
        with self._lock:
            if budget_of(admitted) == budget_of(self._config):
                self._budgets.correct(metered(admitted.tokens, input_tokens, estimate),
                                      metered(admitted.tokens, input_tokens, actual), self._clock(), scale)

    def budget_headers(self, scale: float) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers as the budgets stand now (empty without budgets)."""
        with self._lock:
            self._budgets.refill(self._clock(), scale)
            return self._budgets.headers(scale)

    def refuses_flex(self, config: EndpointConfig) -> bool:
        """Whether a flex call is refused now, for want of the capacity flex is served from."""
        with self._lock:
            return self._rng.random() < config.flex_refuse_rate

    def plan(self, config: EndpointConfig, payload: Mapping[str, Any]) -> tuple[str, float]:
        """Draw the outcome (ok | error | hang) and the real-scale latency of one request; a
        request `fail_when` matches is an error (unless drawn to hang)."""
        with self._lock:
            draw = self._rng.random()
            latency = sample_latency(config, self._rng)
        if draw < config.hang_rate:
            return "hang", config.hang_s
        chosen = bool(config.fail_when) and matches(config.fail_when, payload)
        if draw < config.hang_rate + config.error_rate or chosen:
            return "error", latency
        return "ok", latency

    def reset(self) -> None:
        """Zero the counters and fill the rate limit and budgets (a measurement starts afresh);
        the peak restarts from the requests still in flight."""
        with self._lock:
            self._counts = dict.fromkeys(COUNTERS + TOKEN_COUNTERS, 0)
            self._served.clear()
            self._max_in_flight = self._in_flight
            self._fill_rate_limit(self._config)
            self._fill_budgets(self._config)

    def snapshot(self, scale: float) -> dict[str, Any]:
        with self._lock:
            distinct = len(self._served)
            return {**self._counts, "distinct_served": distinct,
                    "duplicate_served": self._served.total() - distinct,
                    "in_flight": self._in_flight, "max_in_flight": self._max_in_flight,
                    "limit_in_force": self._config.limit_at((self._clock() - self._applied_at) / scale),
                    "config": asdict(self._config)}
