"""Per-minute request and token budgets for the AI stand-in, metered as providers meter them.

Providers meter several budgets at once: OpenAI requests and tokens per minute, Anthropic as
continuously refilled buckets. Each budget here is such a bucket: it holds the per-minute value
and refills at value/60 per real-scale second, so a burst of a whole minute's allowance passes
at once and then one request per refill interval.
Tokens are counted from text length (`consumers.ai.rate_budget.tokens_of`, the clients' estimate
too), not with a tokenizer: the stand-in needs the load's shape, not a model's exact count.

The buckets are not locked: the endpoint or account that owns them calls them under its own lock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

TOKEN_KINDS = ("input", "output", "total")  # which tokens a token budget meters


class Metered(Protocol):
    """The settings budgets are made from: an endpoint's config, or its account's."""

    @property
    def requests_per_minute(self) -> int | None: ...

    @property
    def tokens_per_minute(self) -> int | None: ...

    @property
    def tokens(self) -> str: ...


def budget_of(config: Metered) -> tuple[int | None, int | None, str]:
    """The settings a meter's buckets are made from: changing one starts a new quota."""
    return config.requests_per_minute, config.tokens_per_minute, config.tokens


def metered(kind: str, input_tokens: int, output_tokens: int) -> int:
    """The tokens a budget of `kind` (input | output | total) charges for a request."""
    if kind == "input":
        return input_tokens
    if kind == "output":
        return output_tokens
    return input_tokens + output_tokens


def _trim(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def openai_duration(seconds: float) -> str:
    """A duration as OpenAI writes its `x-ratelimit-reset-*` headers: `12ms`, `1.5s`, `6m0s`."""
    micros = round(seconds * 1e6)
    if micros <= 0:
        return "0s"
    if micros < 1_000_000:
        return f"{_trim(micros / 1000)}ms"
    millis = round(micros / 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs = f"{_trim(millis / 1000) or '0'}s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs


class Bucket:
    """A continuously refilled bucket of `per_minute` units; times are the endpoint's clock
    (wall seconds), so the refill rate per wall second is per_minute / 60 / time_scale."""

    def __init__(self, per_minute: int, now: float) -> None:
        self.per_minute = per_minute
        self.level = float(per_minute)  # may go below zero when a charge is corrected upwards
        self._at = now

    def _rate(self, scale: float) -> float:
        return self.per_minute / 60.0 / scale

    def refill(self, now: float, scale: float) -> None:
        self.level = min(float(self.per_minute), self.level + max(0.0, now - self._at) * self._rate(scale))
        self._at = now

    def wait_s(self, need: float, scale: float) -> float | None:
        """Wall seconds until `need` units are in the bucket (0: now); None when it never holds them."""
        if need > self.per_minute:
            return None
        return max(0.0, need - self.level) / self._rate(scale)

    def reset_s(self, scale: float) -> float:
        """Wall seconds until the bucket is full again."""
        return max(0.0, self.per_minute - self.level) / self._rate(scale)

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.level))


@dataclass(frozen=True)
class Shortfall:
    """Why a budget turned a request away: which one, and wall seconds until it would pass
    (None: the request needs more than the whole budget, so waiting never helps)."""

    kind: str  # requests | tokens
    wait_s: float | None
    message: str = field(default="", compare=False)


class Budgets:
    """An endpoint's request and token buckets; either may be absent (None: not metered)."""

    def __init__(self, requests_per_minute: int | None, tokens_per_minute: int | None, now: float) -> None:
        self.requests = Bucket(requests_per_minute, now) if requests_per_minute else None
        self.tokens = Bucket(tokens_per_minute, now) if tokens_per_minute else None

    @classmethod
    def of(cls, config: Metered, now: float) -> Budgets:
        """Full buckets for a config's budgets."""
        return cls(config.requests_per_minute, config.tokens_per_minute, now)

    def _buckets(self) -> list[tuple[str, Bucket]]:
        pairs = (("requests", self.requests), ("tokens", self.tokens))
        return [(kind, bucket) for kind, bucket in pairs if bucket is not None]

    def refill(self, now: float, scale: float) -> None:
        for _, bucket in self._buckets():
            bucket.refill(now, scale)

    def shortfall(self, tokens: int, scale: float) -> Shortfall | None:
        """The budget a request needing one request and `tokens` tokens would overdraw, the one
        with the longest wait when both would (None: both let it pass). Call after `refill`."""
        worst: Shortfall | None = None
        for kind, bucket in self._buckets():
            need = 1 if kind == "requests" else tokens
            wait = bucket.wait_s(need, scale)
            if wait == 0.0:
                continue
            if wait is None:
                message = (f"Request too large: {need} {kind} needed, the limit is "
                           f"{bucket.per_minute} {kind} per minute")
                return Shortfall(kind, None, message)
            if worst is None or (worst.wait_s is not None and wait > worst.wait_s):
                message = (f"Rate limit reached for {kind} per minute: limit {bucket.per_minute}, "
                           f"remaining {bucket.remaining}, requested {need}")
                worst = Shortfall(kind, wait, message)
        return worst

    def take(self, tokens: int) -> None:
        """Charge an admitted request: one request and its estimated tokens."""
        if self.requests is not None:
            self.requests.level -= 1
        if self.tokens is not None:
            self.tokens.level -= tokens

    def correct(self, charged: int, actual: int, now: float, scale: float) -> None:
        """Replace a request's estimated tokens with the ones its answer actually took."""
        if self.tokens is not None:
            self.tokens.refill(now, scale)
            self.tokens.level = min(float(self.tokens.per_minute), self.tokens.level + charged - actual)

    def headers(self, scale: float) -> dict[str, str]:
        """OpenAI's `x-ratelimit-*` headers for each budget (call after `refill`)."""
        result = {}
        for kind, bucket in self._buckets():
            result[f"x-ratelimit-limit-{kind}"] = str(bucket.per_minute)
            result[f"x-ratelimit-remaining-{kind}"] = str(bucket.remaining)
            result[f"x-ratelimit-reset-{kind}"] = openai_duration(bucket.reset_s(scale))
        return result
