"""What a run's AI calls cost, defined once.

Computed from the attempt rows (`ai_attempts`: one per try, with the tokens and the cost its
answer reported) and the prices the endpoints declare:

- billed: the tries a provider charges for (`billed`; `BILLED_SQL` says the same for the
  queries). A provider bills an answer it produced, usable or not, and one it went on producing
  after the client stopped waiting: a try is billed when a 2xx answer came (`ok`; `bad_answer`,
  a 2xx the stage could not read), when the client gave up on it (`timeout`, unless a non-2xx
  status line was in: the provider had refused it), when a connection broke after a 2xx answer
  began (`connection_error` with a 2xx `http_status`), and when a crash cut it short (`started`,
  never ended). The client cannot say whether an abandoned or crashed try was answered, so it
  counts, erring on the bill's side. Not billed: a 429, 4xx or 5xx (refused or failed: no answer
  was produced), a refused or timed-out connection (nothing was sent), a try not sent, a skip of
  a recorded result.
- a call's cost: what the gateway reported for it; else its tokens x the endpoint's declared
  prices per 1,000 input and output tokens for the tier it was a try of (realtime, or the
  cheaper batch and flex tiers an endpoint may sell); else unknown. A reported 0 gives way to declared
  prices: LiteLLM's proxy reports 0 for a model missing from its price map.
- estimated: a billed try whose answer told neither its cost nor its tokens (cut off, not JSON,
  a crash) is priced at the mean of its stage's `ok` tries whose cost is known, and its tokens
  likewise; with none known at its stage it stays unknown. The provider billed its prompt and
  what it generated, which the client never saw.
- each billed try is one of: used (the first `ok` try of a (request, stage) whose result was
  recorded), failed (the first billed try of a pair without such a try: paid, no result) and
  paid twice (every other billed try of the pair: the provider served the request again, as its
  own count of requests served more than once says). The paid-twice tries are the run's
  duplicate AI calls (measure.figures).
- abandoned: the billed tries the client stopped waiting for (`timeout`) or lost to a crash
  (`started`): each used a slot of the provider's and its bill without bringing an answer.
- tokens_input_per_request, tokens_output_per_request: the tokens of every billed try /
  completed requests.
- cost_per_request, cost_per_1k_requests: the cost of every billed try / completed requests
  (x 1,000): what a configuration pays per delivered request, failed and duplicate calls
  included, as measure.capacity charges every call to the completed requests.
- failed_cost, paid_twice_cost: the cost of the failed and of the paid-twice tries.
- realtime_cost, batch_cost, flex_cost (and `_calls`): the cost and the billed tries of each
  tier, so `<tier>_cost_per_1k_requests` are the parts the cost per 1,000 completed requests is
  made of.
- gateway_over_declared: over the tries with both a reported cost and tokens at declared
  prices, the reported sum / the tokens x prices sum: whether the declared prices agree with
  the gateway's bill.

A sum is unknown (None) when one of its tries' cost is, so where nothing prices the calls the
figures say "unknown", never 0; a sum over no tries is 0. A configuration's figures (`combined`,
over its runs) pool the runs' tries and completed requests.

Plain Python like measure.sizing: rows in, figures with their reasoning out.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ANSWERED = ("ok", "bad_answer")  # a whole 2xx answer came
ABANDONED = ("timeout", "started")  # given up on, or cut short by a crash: billed unless refused
BROKEN = "connection_error"  # billed when a 2xx answer had begun
# `billed` as a predicate over an attempt row's `outcome` and `http_status` (PostgreSQL and Spark SQL).
BILLED_SQL = (f"(outcome IN {ANSWERED + ABANDONED!r} AND (http_status IS NULL OR http_status BETWEEN 200 "
              f"AND 299) OR outcome = '{BROKEN}' AND http_status BETWEEN 200 AND 299)")
USED, PAID_TWICE, FAILED = "used", "paid_twice", "failed"
REALTIME = "realtime"
TIERS = (REALTIME, "batch", "flex")
REPORTED, DECLARED, ESTIMATED, UNKNOWN = "reported", "declared", "estimated", "unknown"
# A run's totals: summed over runs to combine them (None: unknown, and so is any sum with it).
TOTALS = ("completed", "billed_calls", USED, PAID_TWICE, FAILED, "abandoned",
          REPORTED, DECLARED, ESTIMATED, UNKNOWN,
          "tokens_input", "tokens_output", "cost", "failed_cost", "paid_twice_cost",
          "reported_checked", "declared_checked",
          *(f"{tier}_{part}" for tier in TIERS for part in ("calls", "cost")))


@dataclass(frozen=True)
class Prices:
    """An endpoint's declared prices per 1,000 input and output tokens."""

    input_per_1k: float
    output_per_1k: float

    def of(self, tokens_input: float, tokens_output: float) -> float:
        return tokens_input / 1000 * self.input_per_1k + tokens_output / 1000 * self.output_per_1k


@dataclass(frozen=True)
class Attempt:
    """One attempt row as the cost figures read it (consumers.runs.run_figures.ATTEMPTS_SQL's columns)."""

    request_id: str
    stage: str
    outcome: str
    http_status: int | None = None
    tokens_input: int | None = None
    tokens_output: int | None = None
    reported_cost: float | None = None
    resulted: bool = True  # the (request, stage) has a recorded result
    tier: str = REALTIME  # what the try was sold as (`TIERS`)

    @property
    def tokens(self) -> tuple[int, int] | None:
        if self.tokens_input is None or self.tokens_output is None:
            return None
        return self.tokens_input, self.tokens_output


def billed(attempt: Attempt) -> bool:
    """Whether a provider charges for the try (see the module docstring)."""
    status = attempt.http_status
    began = status is not None and 200 <= status < 300
    return ((attempt.outcome in ANSWERED + ABANDONED and (status is None or began))
            or (attempt.outcome == BROKEN and began))


def call_cost(attempt: Attempt, prices: Prices | None) -> tuple[float | None, str]:
    """A try's cost and what gave it: REPORTED, DECLARED (tokens x prices) or UNKNOWN."""
    reported = attempt.reported_cost
    if reported is not None and (reported > 0 or prices is None):
        return reported, REPORTED
    if prices is not None and attempt.tokens is not None:
        return prices.of(*attempt.tokens), DECLARED
    return None, UNKNOWN


def kinds(attempts: Iterable[Attempt]) -> list[tuple[Attempt, str]]:
    """The billed tries, in the order given, each with its kind: USED, PAID_TWICE or FAILED."""
    rows = [attempt for attempt in attempts if billed(attempt)]
    kept: dict[tuple[str, str], int] = {}  # per pair, the try it is billed for once
    for i, attempt in enumerate(rows):
        pair = (attempt.request_id, attempt.stage)
        if pair not in kept or (_used(attempt) and not _used(rows[kept[pair]])):
            kept[pair] = i
    return [(attempt, PAID_TWICE if kept[(attempt.request_id, attempt.stage)] != i
             else USED if _used(attempt) else FAILED) for i, attempt in enumerate(rows)]


def _used(attempt: Attempt) -> bool:
    return attempt.outcome == "ok" and attempt.resulted


def price_of(attempt: Attempt, prices: Mapping[str, Prices | None],
             tier_prices: Mapping[tuple[str, str], Prices]) -> Prices | None:
    """The declared prices a try is charged at: its stage's realtime prices, or its tier's."""
    if attempt.tier == REALTIME:
        return prices.get(attempt.stage)
    return tier_prices.get((attempt.stage, attempt.tier))


def _stage_means(attempts: Sequence[Attempt], prices: Mapping[str, Prices | None],
                 tier_prices: Mapping[tuple[str, str], Prices]
                 ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], tuple[float, float]]]:
    """Per (stage, tier), the mean cost and the mean (input, output) tokens of its `ok` tries
    that know them: what an estimated try is priced at."""
    costs: dict[tuple[str, str], list[float]] = defaultdict(list)
    tokens: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for attempt in attempts:
        if attempt.outcome != "ok":
            continue
        cost, _ = call_cost(attempt, price_of(attempt, prices, tier_prices))
        if cost is not None:
            costs[(attempt.stage, attempt.tier)].append(cost)
        if attempt.tokens is not None:
            tokens[(attempt.stage, attempt.tier)].append(attempt.tokens)
    return ({pair: statistics.fmean(c) for pair, c in costs.items()},
            {pair: (statistics.fmean(i for i, _ in t), statistics.fmean(o for _, o in t))
             for pair, t in tokens.items()})


def _add(total: float | None, value: float | None) -> float | None:
    return None if total is None or value is None else total + value


def _sum(values: Iterable[float | None]) -> float | None:
    total: float | None = 0  # counts stay integers
    for value in values:
        total = _add(total, value)
    return total


def run_costs(attempts: Iterable[Attempt], completed: int, prices: Mapping[str, Prices | None],
              tier_prices: Mapping[tuple[str, str], Prices] | None = None) -> dict[str, Any]:
    """A run's cost figures from its attempt rows (ordered as written), its completed requests,
    each AI stage's declared prices (None: none declared) and those of the other tiers its
    endpoint sells, by (stage, tier)."""
    rows = list(attempts)
    tier_prices = tier_prices or {}
    cost_means, token_means = _stage_means(rows, prices, tier_prices)
    totals: dict[str, Any] = {key: 0 for key in TOTALS}
    totals.update(completed=completed, tokens_input=0.0, tokens_output=0.0, cost=0.0, failed_cost=0.0,
                  paid_twice_cost=0.0, reported_checked=0.0, declared_checked=0.0,
                  **{f"{tier}_cost": 0.0 for tier in TIERS})
    unpriced: set[str] = set()
    for attempt, kind in kinds(rows):
        price = price_of(attempt, prices, tier_prices)
        cost, source = call_cost(attempt, price)
        pair = (attempt.stage, attempt.tier)
        if cost is None and pair in cost_means:
            cost, source = cost_means[pair], ESTIMATED
        tokens = attempt.tokens or token_means.get(pair)
        if cost is None:
            unpriced.add(attempt.stage)
        totals["billed_calls"] += 1
        totals[kind] += 1
        totals["abandoned"] += attempt.outcome in ABANDONED
        totals[source] += 1
        totals["tokens_input"] = _add(totals["tokens_input"], tokens[0] if tokens else None)
        totals["tokens_output"] = _add(totals["tokens_output"], tokens[1] if tokens else None)
        totals["cost"] = _add(totals["cost"], cost)
        totals[f"{attempt.tier}_calls"] += 1
        totals[f"{attempt.tier}_cost"] = _add(totals[f"{attempt.tier}_cost"], cost)
        if kind != USED:
            totals[f"{kind}_cost"] = _add(totals[f"{kind}_cost"], cost)
        if attempt.reported_cost is not None and price is not None and attempt.tokens is not None:
            totals["reported_checked"] += attempt.reported_cost
            totals["declared_checked"] += price.of(*attempt.tokens)
    figures = _derived(totals)
    if unpriced:
        figures["reasoning"].append(
            f"unknown at {', '.join(sorted(unpriced))}: no reported cost, no tokens at declared prices, "
            "and no ok call of the stage whose cost is known")
    return figures


def combined(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A configuration's cost figures over its runs (run_costs results): their tries and
    completed requests pooled."""
    return _derived({key: _sum(run[key] for run in runs) for key in TOTALS})


def _per(total: float | None, completed: int, scale: float = 1.0) -> float | None:
    return None if total is None or completed <= 0 else scale * total / completed


def _derived(totals: Mapping[str, Any]) -> dict[str, Any]:
    """The totals with the figures made of them, and the reasoning."""
    n = totals["completed"]
    cost = totals["cost"]
    per_1k = _per(cost, n, 1000)
    checked = totals["declared_checked"]
    figures = {
        **totals,
        "tokens_input_per_request": _per(totals["tokens_input"], n),
        "tokens_output_per_request": _per(totals["tokens_output"], n),
        "cost_per_request": _per(cost, n),
        "cost_per_1k_requests": per_1k,
        "gateway_over_declared": totals["reported_checked"] / checked if checked else None,
        **{f"{tier}_cost_per_1k_requests": _per(totals[f"{tier}_cost"], n, 1000) for tier in TIERS},
    }
    figures["reasoning"] = [
        f"{totals['billed_calls']} billed tries: {totals[USED]} used, {totals[PAID_TWICE]} paid twice, "
        f"{totals[FAILED]} failed; {totals['abandoned']} of them abandoned (timed out or cut by a crash)",
        f"priced by the gateway's reported cost {totals[REPORTED]}, by tokens x declared prices "
        f"{totals[DECLARED]}, at their stage's mean ok call {totals[ESTIMATED]}, unknown {totals[UNKNOWN]}",
        f"tokens per completed request: {shown(totals['tokens_input'])} input, "
        f"{shown(totals['tokens_output'])} output / {n} = {shown(figures['tokens_input_per_request'])}, "
        f"{shown(figures['tokens_output_per_request'])}",
        f"cost per 1,000 completed requests: {shown(cost)} / {n} x 1000 = {shown(per_1k)}",
        f"failed calls cost {shown(totals['failed_cost'])}, "
        f"paid-twice calls {shown(totals['paid_twice_cost'])}",
        "by tier: " + ", ".join(
            f"{tier} {totals[f'{tier}_calls']} tries costing {shown(totals[f'{tier}_cost'])}"
            for tier in TIERS if totals[f"{tier}_calls"]),
    ]
    return figures


def shown(value: float | None) -> str:
    """A figure as printed: 'unknown' where nothing priced (or counted) the calls, never 0."""
    return "unknown" if value is None else f"{value:.6g}"
