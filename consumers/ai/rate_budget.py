"""Requests and tokens per minute for one AI endpoint, spent before each try is sent.

Providers meter a minute's requests and tokens and refuse with 429 once one is spent, whatever
the calls in flight: a refusal of that kind says "later", not "fewer at once", so it never
reaches the concurrency limit (`consumers.ai.limit`), which would halve on it and
starve. Here each budget mirrors the meter: a try takes one request and its estimated tokens
(the prompt's length in characters / 4, plus `max_tokens` or the answers' mean), waiting while
either budget is short, and the estimate is corrected from the answer's `usage` (or its length)
when it comes back. One budget serves every member of a fleet.

Meters come in two kinds, told apart by what the answers announce (`consumers.ai.meters`): a
continuously refilled bucket (`x-ratelimit-{limit,remaining,reset}-*`) and a fixed period (a
limit and what remains, no reset).

A budget refusal empties its budget until its `Retry-After`, without one until a refilled
budget covers the try or a period turns.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from consumers.ai.meters import RECHECK_S, PeriodBudget, RefilledBudget
from consumers.ai.waits import Cancelled

REQUESTS, TOKENS = "requests", "tokens"
OUTPUT_WEIGHT = 0.1  # each answer's weight in the running mean of answer tokens
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
PERIOD_S = 60.0  # a meter that announces no reset counts minutes of the real clock


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


@dataclass(frozen=True)
class Spent:
    """What one try took of each budget, and the period of each it was taken in."""

    needs: Mapping[str, float]
    generations: Mapping[str, int]
    marks: Mapping[str, float]  # all tries' needs taken so far, this one's included


class RateBudget:
    """The per-minute budgets of one endpoint (thread-safe; with none known, `take` never waits)."""

    def __init__(self, requests_per_minute: int | None = None, tokens_per_minute: int | None = None,
                 minute_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 history: int = 10_000) -> None:
        self._clock = clock
        self._minute_s = minute_s
        self._lock = threading.Lock()
        now = clock()
        self._budgets: dict[str, RefilledBudget | PeriodBudget] = {
            kind: RefilledBudget(size, minute_s, size, now)
            for kind, size in ((REQUESTS, requests_per_minute), (TOKENS, tokens_per_minute)) if size}
        self._output_mean: float | None = None
        self._out = {REQUESTS: 0.0, TOKENS: 0.0}  # taken by tries not back yet
        self._taken = {REQUESTS: 0.0, TOKENS: 0.0}  # taken by all tries so far
        # (at, kind, budget per minute, a turn learned) when a budget learned from the answers
        # changes or its period's turn is learned, until collected; `at` a reading of `clock`
        self.changes: deque[tuple[float, str, float, bool]] = deque(maxlen=history)
        self._noted: dict[str, tuple[float, int]] = {}
        self._waiting = 0  # callers in `take`
        self._announced: dict[str, float] = {}  # each budget's limit as the answers announce it

    def usage(self) -> tuple[int, dict[str, float]]:
        """Callers waiting for a budget now, and all tries' requests and tokens taken so far:
        what a quota's holder reads its demand from."""
        with self._lock:
            return self._waiting, dict(self._taken)

    @property
    def announced(self) -> dict[str, float]:
        """Each budget's limit per minute as the endpoint's answers last announced it."""
        with self._lock:
            return dict(self._announced)

    def share(self, kind: str, per_minute: float | None) -> None:
        """What a quota shared with other fleets grants of budget `kind` per minute (None:
        none binds). A budget not known yet starts at it, empty (see `RefilledBudget.shared`),
        its size unknown until the endpoint's answers announce it."""
        with self._lock:
            now = self._clock()
            budget = self._budgets.get(kind)
            if budget is None and per_minute is not None:
                budget = self._budgets[kind] = RefilledBudget(math.inf, self._minute_s, 0.0, now)
            if isinstance(budget, RefilledBudget):
                budget.shared(per_minute, now)

    @property
    def known(self) -> dict[str, float]:
        """The budgets known now, per minute of the endpoint's clock."""
        with self._lock:
            return {kind: b.size for kind, b in self._budgets.items()}

    def estimate(self, payload: Mapping[str, Any]) -> Estimate:
        """A try's tokens before it is sent: its text, and `max_tokens` or the answers' mean."""
        prompt = tokens_of("".join(strings_of(payload)))
        answer = payload.get("max_tokens")
        if not isinstance(answer, int):
            with self._lock:
                answer = round(self._output_mean or 0.0)
        return Estimate(prompt, prompt + answer)

    def take(self, tokens: int, cancel: threading.Event | None = None) -> Spent:
        """Spend one request and `tokens` for a try about to be sent, waiting while either
        budget is short (`Cancelled` once `cancel` is set); what it took goes back with `ended`."""
        with self._lock:
            self._waiting += 1
        try:
            while True:
                wait, spent = self.try_take(tokens)
                if spent is not None:
                    return spent
                if cancel is not None and cancel.wait(min(wait, RECHECK_S)):
                    raise Cancelled
                if cancel is None:
                    time.sleep(min(wait, RECHECK_S))
        finally:
            with self._lock:
                self._waiting -= 1

    def try_take(self, tokens: int) -> tuple[float, Spent | None]:
        """Spend one request and `tokens` if both budgets have them, else the seconds until
        they will."""
        with self._lock:
            now = self._clock()
            needs = {REQUESTS: 1.0, TOKENS: float(tokens)}
            wait = max((b.wait_for(needs[kind], now) for kind, b in self._budgets.items()), default=0.0)
            if wait > 0:
                return wait, None
            for kind, budget in self._budgets.items():
                budget.spend(needs[kind], now)
            for kind, need in needs.items():
                self._out[kind] += need
                self._taken[kind] += need
            return 0.0, Spent(needs, {kind: b.generation for kind, b in self._budgets.items()},
                              dict(self._taken))

    def ended(self, spent: Spent, answered: bool) -> None:
        """A try is back (`answered`: with a 2xx, which a meter's announcements count)."""
        with self._lock:
            for kind, need in spent.needs.items():
                self._out[kind] -= need
                budget = self._budgets.get(kind)
                if budget is not None:
                    budget.ended(spent.generations.get(kind, 0), need, answered)

    def settle(self, spent: Spent, estimate: Estimate, answer: Mapping[str, Any]) -> None:
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
            budget = self._budgets.get(TOKENS)
            if budget is not None:
                budget.credit(estimate.total - actual, spent.generations.get(TOKENS, 0))

    def observe(self, headers: Mapping[str, str], spent: Spent) -> None:
        """What the endpoint announced with the answer to the try that took `spent`: a budget's
        size, what is left, and when it is full again (a refilled budget) or nothing of that (a
        fixed period)."""
        with self._lock:
            now = self._clock()
            for kind in (REQUESTS, TOKENS):
                limit = header_number(headers.get(f"x-ratelimit-limit-{kind}"))
                remaining = header_number(headers.get(f"x-ratelimit-remaining-{kind}"))
                if not limit or remaining is None:
                    continue
                reset = duration_s(headers.get(f"x-ratelimit-reset-{kind}"))
                self._announced[kind] = limit
                if kind not in self._budgets:  # (a period seen now ends by a period from now)
                    out = self._out[kind]
                    self._budgets[kind] = (  # a full bucket announces a reset of "0s": still a bucket
                        RefilledBudget(limit, self._minute_s, limit, now) if reset is not None else
                        PeriodBudget(limit, PERIOD_S, ends=now + PERIOD_S, level=limit - out, taken=out,
                                     out=out, answered=limit - remaining))
                budget = self._budgets[kind]
                budget.announced(limit, remaining, reset, now, self._taken[kind] - spent.marks[kind])
                noted = (round(budget.size * PERIOD_S / budget.period_s, 1), budget.turns_seen)
                if noted != self._noted.get(kind):
                    turned = kind in self._noted and noted[1] != self._noted[kind][1]
                    self._noted[kind] = noted
                    self.changes.append((now, kind, noted[0], turned))

    def refused(self, kind: str, retry_after_s: float | None, headers: Mapping[str, str],
                spent: Spent) -> None:
        """A budget refusal of a try that took `spent`: that budget is empty until the
        `Retry-After`, or its refill or turn (see the budgets' `refused`)."""
        self.observe(headers, spent)
        with self._lock:
            budget = self._budgets.get(kind)
            if budget is None:
                return  # a budget never announced: the client's backoff spaces the tries
            budget.refused(retry_after_s, self._clock(), spent.generations.get(kind, 0))


def header_number(value: str | None) -> float | None:
    """A header's value as a number (`Retry-After`'s seconds, a budget's limit), None when it is
    absent or not one."""
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
