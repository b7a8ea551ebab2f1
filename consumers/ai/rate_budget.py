"""Requests and tokens per minute for one AI endpoint, spent before each try is sent.

Providers meter a minute's requests and tokens as continuously refilled buckets and refuse
with 429 once one is spent, whatever the calls in flight: a refusal of that kind says "later",
not "fewer at once", so it never reaches the concurrency limit (`consumers.ai.concurrency_limit`),
which would halve on it and starve. Here each bucket mirrors the provider's: a try takes one
request and its estimated tokens (the prompt's length in characters / 4, plus `max_tokens` or
the answers' mean), waiting while either bucket is short, and the estimate is corrected from
the answer's `usage` (or its length) when it comes back.

A bucket's size and refill come from what the endpoint declares (per real-scale minute, so a
time scale shortens the minute), or from what it announces: OpenAI's
`x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, with the refill read off as
(limit - remaining) / reset, which holds at any time scale (a gateway that sends no reset is
taken to count real minutes). A budget refusal empties its bucket until its `Retry-After`, or
until the refill covers the try when there is none. One budget serves every member of a fleet.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

REQUESTS, TOKENS = "requests", "tokens"
OUTPUT_WEIGHT = 0.1  # each answer's weight in the running mean of answer tokens
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def tokens_of(text: str) -> int:
    """Tokens as the providers' rule of thumb counts them, without a tokenizer: 4 characters each."""
    return math.ceil(len(text) / 4)


def strings_of(value: Any) -> list[str]:
    """Every string inside a JSON value (the text a request or an answer carries)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in strings_of(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_of(v)]
    return []


def duration_s(value: str | None) -> float | None:
    """An OpenAI reset duration (`12ms`, `1.5s`, `6m0s`) or plain seconds, in seconds."""
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        parts = _DURATION.findall(value)
        return sum(float(n) * _UNIT_S[unit] for n, unit in parts) if parts else None


@dataclass(frozen=True)
class Estimate:
    """A try's tokens as counted before it is sent: its prompt's, and those with the answer's."""

    prompt: int
    total: int


@dataclass
class Bucket:
    """One budget: `size` per `window_s`, refilled continuously; `level` what is left now."""

    size: float
    window_s: float
    level: float
    at: float  # when `level` was counted: it refills from then on
    held_until: float = -math.inf
    refusals: int = 0  # budget refusals since the last answer

    def refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.size, self.level + (now - self.at) * self.size / self.window_s)
            self.at = now

    def wait_for(self, need: float, now: float) -> float:
        """Seconds until `need` can be taken (0: now)."""
        self.refill(now)
        short = min(need, self.size) - self.level
        short = short if short > 1e-9 else 0.0  # (a refill timed to the need lands a rounding short)
        return max(self.held_until - now, short * self.window_s / self.size)


class RateBudget:
    """The per-minute budgets of one endpoint (thread-safe; with none known, `take` never waits)."""

    def __init__(self, requests_per_minute: int | None = None, tokens_per_minute: int | None = None,
                 minute_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._minute_s = minute_s
        self._lock = threading.Lock()
        now = clock()
        self._buckets: dict[str, Bucket] = {
            kind: Bucket(size, minute_s, size, now)
            for kind, size in ((REQUESTS, requests_per_minute), (TOKENS, tokens_per_minute)) if size}
        self._output_mean: float | None = None

    @property
    def known(self) -> dict[str, float]:
        """The budgets known now, per minute of the endpoint's clock."""
        with self._lock:
            return {kind: b.size for kind, b in self._buckets.items()}

    def estimate(self, payload: Mapping[str, Any]) -> Estimate:
        """A try's tokens before it is sent: its text, and `max_tokens` or the answers' mean."""
        prompt = tokens_of("".join(strings_of(payload)))
        answer = payload.get("max_tokens")
        if not isinstance(answer, int):
            with self._lock:
                answer = round(self._output_mean or 0.0)
        return Estimate(prompt, prompt + answer)

    def take(self, tokens: int) -> None:
        """Spend one request and `tokens` for a try about to be sent, waiting while either
        budget is short."""
        while (wait := self.try_take(tokens)) > 0:
            time.sleep(wait)

    def try_take(self, tokens: int) -> float:
        """Spend one request and `tokens` if both budgets have them (0), else the seconds until
        they will."""
        with self._lock:
            now = self._clock()
            needs = {REQUESTS: 1.0, TOKENS: float(tokens)}
            wait = max((b.wait_for(needs[kind], now) for kind, b in self._buckets.items()), default=0.0)
            if wait <= 0:
                for kind, bucket in self._buckets.items():
                    bucket.level -= needs[kind]
            return wait

    def settle(self, estimate: Estimate, answer: Mapping[str, Any]) -> None:
        """The answer is in: its tokens (`usage`, or its text's length) replace the estimate."""
        usage = answer.get("usage")
        if not isinstance(usage, Mapping):
            usage = {}
        output = usage.get("completion_tokens")
        if not isinstance(output, int):
            output = tokens_of("".join(strings_of({k: v for k, v in answer.items() if k != "usage"})))
        total = usage.get("total_tokens")
        actual = total if isinstance(total, int) else estimate.prompt + output
        with self._lock:
            self._output_mean = output if self._output_mean is None else \
                self._output_mean + OUTPUT_WEIGHT * (output - self._output_mean)
            bucket = self._buckets.get(TOKENS)
            if bucket is not None:
                bucket.level = min(bucket.size, bucket.level + estimate.total - actual)

    def observe(self, headers: Mapping[str, str]) -> None:
        """What the endpoint announced with an answer: a budget's size, what is left and when
        it is full again."""
        with self._lock:
            now = self._clock()
            for kind in (REQUESTS, TOKENS):
                limit = _number(headers.get(f"x-ratelimit-limit-{kind}"))
                remaining = _number(headers.get(f"x-ratelimit-remaining-{kind}"))
                if not limit or remaining is None:
                    continue
                bucket = self._buckets.setdefault(kind, Bucket(limit, self._minute_s, limit, now))
                bucket.refill(now)
                bucket.size, bucket.refusals = limit, 0
                reset = duration_s(headers.get(f"x-ratelimit-reset-{kind}"))
                if reset and remaining < limit:
                    bucket.window_s = reset * limit / (limit - remaining)
                # What is left there, less what our tries sent since spent of it, never more
                # than our own count (an answer overtaken by others is older than it).
                bucket.level = min(bucket.level, remaining)

    def refused(self, kind: str, retry_after_s: float | None, headers: Mapping[str, str]) -> None:
        """A budget refusal: its bucket is empty until the `Retry-After`. Without one, it holds
        the time a try's refill takes (a request's, or a hundredth of the tokens), twice as long
        after each refusal in a row up to a quarter of the minute, and refills only a try
        meanwhile: a meter that counts clock minutes (LiteLLM's proxy) refuses until its minute
        ends, whatever the refill, and counts each refusal against the next try; halving the
        pace each time costs a handful of 429s there instead of one per refill, and a quarter
        minute at most of the next minute's budget."""
        refusals = self._buckets[kind].refusals if kind in self._buckets else 0
        self.observe(headers)
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(kind)
            if bucket is None:
                return  # a budget never announced: the client's backoff spaces the tries
            bucket.refill(now)
            bucket.level = min(bucket.level, 0.0)
            bucket.refusals = refusals + 1
            if retry_after_s is not None:
                bucket.held_until = max(bucket.held_until, now + retry_after_s)
                return
            a_try = max(bucket.window_s / bucket.size, bucket.window_s / 100)
            bucket.held_until = max(bucket.held_until,
                                    now + min(bucket.window_s / 4, a_try * 2 ** (bucket.refusals - 1)))
            bucket.at = max(bucket.at, bucket.held_until - a_try)


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
