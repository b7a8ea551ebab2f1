"""A pipeline's capacity: the binding limit over every AI endpoint a request reaches.

Each endpoint e has a concurrency and may have per-minute budgets (real-scale minutes, as the
spec declares them; at time scale k a minute lasts 60 k wall-clock seconds). A request makes
calls_e successful calls on it on average, each taking service_e seconds (the mean of its
successful calls, wall clock) and tokens_e tokens (the kind its budget counts). Each limit
allows, in requests/s:

    concurrency       concurrency_e / (service_e x calls_e)
    requests budget   requests_per_minute_e / (60 k) / calls_e
    tokens budget     tokens_per_minute_e / (60 k) / (tokens_e x calls_e)

capacity = the lowest of them over every endpoint; the limit giving it is the binding one,
named `<endpoint>.<dimension>` (`summarize.concurrency`, `draft.tokens_per_minute`). Where
several stages call one endpoint, their terms add up (service x calls, calls, tokens x calls).

The requests counted are completed requests, and calls_e counts every successful call on the
endpoint (of requests later rejected or dead-lettered too) per completed request: the
throughput (completions per second) and the capacity count the same requests, and the calls a
blocked post cost its moderation endpoint are charged to the posts that went through. Fan-out
counts each branch on its own endpoint; an endpoint that a share of the requests reach has
calls_e below 1.

A budget whose tokens per call were not measured is left out and named in `unmeasured`: the
capacity is then an upper bound, which makes a utilization read low, never past 1.

A budget also lets an allowance through at once, beside its rate (a candidate's `allowance`, in
requests): a continuously refilled bucket (the stand-in's, OpenAI's, Anthropic's) starts full
with a minute's budget, so N calls through a bucket of depth D refilled at r a second take at
least (N - D) / r seconds, not N / r: 3000 calls at 600 a minute at time scale 0.25 (40/s) take
60 s, not 75. Fixed periods of a clock minute (LiteLLM's proxy and Router) may pass the end of
one period and the start of the next at once: two clock minutes' budget (`fixed_periods`). The
physical minimum (measure.figures) and served_check count it; the capacity, a rate, does not.

utilization: the share of the binding limit the run used on the plateau (the steady band of
measure.figures): the binding endpoint's call-seconds inside the band / (concurrency x band) for
a concurrency; for a budget, the calls started inside the band (a meter counts a call when it
arrives), or their tokens, over what the budget allows there: its rate x the band, plus what its
allowance can still hold when the band begins (`allowance_left`: the allowance, less what the
calls started before the band took beyond the refill since the first one). A band that begins
while the first minute's allowance is being spent would otherwise read its rate exceeded. Fixed
periods of a clock minute are held to their rate alone: what a period let through before the
band is not counted, and two periods' budget as their allowance would make a band of a few
minutes read far below a period meter kept full, so a band whose ends fall mid-period may read
past 1 by a share of one period's budget (docs/benchmarks.md#reading-the-figures). In
expectation it is steady_throughput_rps / capacity_rps; it counts calls rather than completions
because completions of a fan-out join catch up inside the band (a post summarised early waits
for its labels) and heavy-tailed calls make a completion slope noisy, past 1 of a capacity its
calls never exceeded. Counted on calls, a limit the service enforces keeps it at most 1.

served_check: what the service served on the binding endpoint over a window that began with its
budgets full, against the calls the binding limit allows over it: its rate x the window, plus a
budget's allowance in calls; `share_of_limit` cannot pass 1 where the service enforces the limit.

Plain Python, like measure.sizing: the benchmark's SQL side, the Spark analysis and the gate
share it, and every result carries its reasoning.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

DIMENSIONS = ("concurrency", "requests_per_minute", "tokens_per_minute")
BUCKET = 1.0  # a continuously refilled bucket, full at the start: one minute's budget at once


TOKEN_KINDS = ("input", "output", "total")


@dataclass(frozen=True)
class EndpointLimits:
    """One AI endpoint's limits: calls at once, and budgets per real-scale minute (None: none)."""

    concurrency: int
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens: str = "total"  # which tokens tokens_per_minute counts: input, output or total
    # The budgets' worth, in minutes, the meter may let through at once (see the module
    # docstring): 1 for a continuously refilled bucket that starts full.
    allowance_minutes: float = BUCKET
    fixed_period: bool = False  # a meter of clock minutes (`fixed_periods`), not a refilled bucket


def fixed_periods(endpoint: EndpointLimits, time_scale: float) -> EndpointLimits:
    """`endpoint` metered in fixed periods of a clock minute (LiteLLM's proxy and Router): the end
    of one period and the start of the next may pass at once, each a clock minute's budget,
    which is 1 / time_scale of the run's minutes' (a run's minute lasts 60 x time_scale wall
    seconds): an allowance of 2 / time_scale run minutes."""
    return replace(endpoint, allowance_minutes=2.0 / time_scale, fixed_period=True)


@dataclass(frozen=True)
class Limits:
    """Every endpoint's limits, the endpoint each AI stage calls, the run's time scale and the
    measured tokens per call of the endpoints (of the kind their budget counts)."""

    endpoints: Mapping[str, EndpointLimits]
    stage_endpoint: Mapping[str, str]
    time_scale: float = 1.0
    tokens_per_call: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def uniform(cls, concurrency: int, stages: Iterable[str]) -> Limits:
        """One endpoint per stage, named after it, each with `concurrency` and no budgets: what a
        caller that knows only the run's concurrency limit can say."""
        names = list(stages)
        return cls({s: EndpointLimits(concurrency) for s in names}, {s: s for s in names})


@dataclass(frozen=True)
class Candidate:
    endpoint: str
    dimension: str
    rps: float | None  # None: not measured (no calls, or no tokens per call)
    reasoning: str
    # Requests a budget lets through at once before its rate: its bucket's depth (a whole
    # minute's allowance, full at the start) in requests; 0 for a concurrency.
    allowance: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.endpoint}.{self.dimension}"


@dataclass(frozen=True)
class Capacity:
    rps: float | None
    binding: Candidate | None
    candidates: tuple[Candidate, ...]

    @property
    def binding_limit(self) -> str | None:
        return self.binding.name if self.binding else None

    @property
    def unmeasured(self) -> list[str]:
        return [c.name for c in self.candidates if c.rps is None]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the capacity, the binding limit and every candidate with its figure."""
        return {"capacity_rps": self.rps, "binding_limit": self.binding_limit,
                "candidates": {c.name: None if c.rps is None else round(c.rps, 3) for c in self.candidates},
                "reasoning": [c.reasoning for c in self.candidates], "unmeasured": self.unmeasured}


def calls_per_request(ok_calls: Mapping[str, int], completed: int) -> dict[str, float]:
    """Successful calls of each stage per completed request (see the module docstring)."""
    return {stage: n / completed for stage, n in ok_calls.items()} if completed > 0 else {}


def tokens_per_call(kind: str, served: int, tokens_input: int, tokens_output: int) -> float | None:
    """Tokens of the kind a budget counts per served call, from the service's counters."""
    if served <= 0:
        return None
    counted = {"input": tokens_input, "output": tokens_output, "total": tokens_input + tokens_output}[kind]
    return counted / served


def _per_endpoint(limits: Limits, values: Mapping[str, float]) -> dict[str, float]:
    """A per-stage figure summed over the stages of each endpoint."""
    summed: dict[str, float] = {}
    for stage, value in values.items():
        endpoint = limits.stage_endpoint.get(stage)
        if endpoint is not None:
            summed[endpoint] = summed.get(endpoint, 0.0) + value
    return summed


def candidates(limits: Limits, service_s: Mapping[str, float],
               calls: Mapping[str, float]) -> list[Candidate]:
    """Every limit of every endpoint the requests reached, with the requests/s it allows."""
    busy = _per_endpoint(limits, {s: service_s.get(s, 0.0) * c for s, c in calls.items()})
    reach = _per_endpoint(limits, calls)
    minute = 60 * limits.time_scale
    found = []
    for name, e in limits.endpoints.items():
        n = reach.get(name, 0.0)
        if n <= 0:
            continue  # no request reached it in this run: it limits nothing measured
        work = busy.get(name, 0.0)
        found.append(Candidate(name, "concurrency", e.concurrency / work if work > 0 else None,
                               f"{name}.concurrency: {e.concurrency} / ({work / n:.5g} s x {n:.4g} calls) "
                               f"= {e.concurrency / work:.4g} rps" if work > 0
                               else f"{name}.concurrency: no call time measured"))
        if e.requests_per_minute:
            rps = e.requests_per_minute / minute / n
            found.append(Candidate(name, "requests_per_minute", rps,
                                   f"{name}.requests_per_minute: {e.requests_per_minute} / {minute:g} s / "
                                   f"{n:.4g} calls = {rps:.4g} rps",
                                   e.requests_per_minute * e.allowance_minutes / n))
        if e.tokens_per_minute:
            tokens = limits.tokens_per_call.get(name)
            token_rps = e.tokens_per_minute / minute / (tokens * n) if tokens else None
            found.append(Candidate(name, "tokens_per_minute", token_rps,
                                   f"{name}.tokens_per_minute: {e.tokens_per_minute} / {minute:g} s / "
                                   f"({tokens:.5g} {e.tokens} tokens x {n:.4g} calls) = {token_rps:.4g} rps"
                                   if token_rps is not None else
                                   f"{name}.tokens_per_minute: {e.tokens} tokens per call not measured",
                                   e.tokens_per_minute * e.allowance_minutes / (tokens * n)
                                   if tokens else 0.0))
    return found


def capacity(limits: Limits, service_s: Mapping[str, float], calls: Mapping[str, float]) -> Capacity:
    """The binding limit and the requests/s it allows (see the module docstring)."""
    found = candidates(limits, service_s, calls)
    measured = [c for c in found if c.rps is not None]
    binding = min(measured, key=lambda c: c.rps or 0.0) if measured else None
    return Capacity(binding.rps if binding else None, binding, tuple(found))


def mean_call_s(limits: Limits, service_s: Mapping[str, float], calls: Mapping[str, float],
                endpoint: str) -> float:
    """The mean seconds of one successful call on `endpoint`, over the stages that call it."""
    n = _per_endpoint(limits, calls).get(endpoint, 0.0)
    busy = _per_endpoint(limits, {s: service_s.get(s, 0.0) * c for s, c in calls.items()})
    return busy.get(endpoint, 0.0) / n if n > 0 else 0.0


def limit_schedules(limits: Limits, service_s: Mapping[str, float], calls: Mapping[str, float],
                    endpoint: str | None = None, concurrency: Sequence[tuple[float, int]] = ()
                    ) -> list[tuple[Candidate, list[tuple[float, float]]]]:
    """Every measured limit with the requests/s it allows as (from_s, rps) pieces: one piece, but
    for `endpoint`'s concurrency when `concurrency` gives its schedule, (from_s, slots)."""
    found = []
    for c in candidates(limits, service_s, calls):
        if c.rps is None:
            continue
        if c.endpoint == endpoint and c.dimension == "concurrency" and concurrency:
            slots = limits.endpoints[c.endpoint].concurrency
            found.append((c, [(at, c.rps * limit / slots) for at, limit in concurrency]))
        else:
            found.append((c, [(0.0, c.rps)]))
    return found


@dataclass(frozen=True)
class BandWork:
    """One AI stage's successful calls against the steady band: the seconds they spent inside it
    (what a concurrency's slots gave them), the calls started inside it (what a budget admitted
    there, as a meter counts a call when it arrives), and for what a budget's allowance still
    held when the band began, the calls started before it and when the first one started (the
    band's clock; None: none started)."""

    busy_s: float = 0.0
    started: int = 0
    before: int = 0
    first_s: float | None = None


def band_work(calls: Iterable[tuple[str, float, float]], band: tuple[float, float] | None
              ) -> dict[str, BandWork]:
    """Per stage, the BandWork of successful calls given as (stage, started, ended) in the band's
    clock."""
    work: dict[str, BandWork] = {}
    if band is None:
        return work
    start, end = band
    for stage, started, ended in calls:
        w = work.get(stage, BandWork())
        work[stage] = BandWork(w.busy_s + max(0.0, min(ended, end) - max(started, start)),
                               w.started + (start <= started <= end), w.before + (started < start),
                               started if w.first_s is None else min(w.first_s, started))
    return work


def allowance_left(depth: float, rate: float, before: float, since_first_s: float) -> float:
    """What a bucket of `depth`, full when the first call came and refilled at `rate` per second,
    can hold at most `since_first_s` later, after `before` was taken from it: its depth, less
    what was taken beyond the refill."""
    return min(depth, max(0.0, depth + rate * since_first_s - before))


def utilization(cap: Capacity, limits: Limits, work: Mapping[str, BandWork],
                band: tuple[float, float] | None) -> float | None:
    """The share of the binding limit used inside the steady band (see the module docstring)."""
    binding = cap.binding
    if binding is None or band is None or band[1] <= band[0]:
        return None
    band_s = band[1] - band[0]
    mine = [work[s] for s, e in limits.stage_endpoint.items() if e == binding.endpoint and s in work]
    e = limits.endpoints[binding.endpoint]
    if binding.dimension == "concurrency":
        return sum(w.busy_s for w in mine) / (e.concurrency * band_s)
    started, before = sum(w.started for w in mine), sum(w.before for w in mine)
    firsts = [w.first_s for w in mine if w.first_s is not None]
    since_first = band[0] - min(firsts) if firsts else 0.0
    minute = 60 * limits.time_scale
    if binding.dimension == "requests_per_minute" and e.requests_per_minute:
        rate = e.requests_per_minute / minute
        left = 0.0 if e.fixed_period else allowance_left(e.requests_per_minute, rate, before, since_first)
        return started / (rate * band_s + left)
    tokens = limits.tokens_per_call.get(binding.endpoint)
    if e.tokens_per_minute and tokens:
        rate = e.tokens_per_minute / minute
        left = 0.0 if e.fixed_period else allowance_left(e.tokens_per_minute, rate, before * tokens,
                                                                 since_first)
        return started * tokens / (rate * band_s + left)
    return None


def served_check(cap: Capacity, calls: Mapping[str, float], limits: Limits, served: int | None,
                 window_s: float | None) -> dict[str, Any] | None:
    """What the service counted on the binding endpoint over a window that began with its
    budgets full (its `served` counter since the burst began) against the calls the binding limit
    allows there: the rate (capacity x calls per request on it) over the window, plus for a
    budget its bucket's depth (`allowance` x calls per request), which the window's first
    instants may spend at once. `limit_calls_rps` is that total over the window."""
    binding = cap.binding
    if binding is None or binding.rps is None or served is None or not window_s or window_s <= 0:
        return None
    per_request = _per_endpoint(limits, calls).get(binding.endpoint, 0.0)
    allowed = binding.rps * per_request * window_s + binding.allowance * per_request
    rate = served / window_s
    return {"endpoint": binding.endpoint, "served": served, "window_s": round(window_s, 3),
            "served_rps": round(rate, 3), "limit_calls_rps": round(allowed / window_s, 3),
            "initial_allowance_calls": round(binding.allowance * per_request, 3),
            "share_of_limit": round(served / allowed, 4) if allowed > 0 else None}
