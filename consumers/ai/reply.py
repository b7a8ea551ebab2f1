"""What an AI endpoint's reply says: the tokens and cost it used (`Usage`), what a 429 says ran
out (`refusal_kind`), and one POST's reply as the client's tries and its gates read it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from consumers.ai.admission import CONCURRENCY
from consumers.ai.rate_budget import REQUESTS, TOKENS

COST_HEADER = "x-litellm-response-cost"  # the cost LiteLLM's proxy reports for each call

FLEX_SHORT = "resource_unavailable"  # a 429's kind when the provider is short of flex capacity


@dataclass(frozen=True)
class Usage:
    """What one answer says it used: the input and output tokens of an OpenAI-compatible
    `usage` and the cost a gateway reports in COST_HEADER; None for what it does not say."""

    tokens_input: int | None = None
    tokens_output: int | None = None
    reported_cost: float | None = None

    @classmethod
    def of(cls, body: Any, headers: Mapping[str, str]) -> Usage:
        """Read from an answer's JSON body and its (lower-cased) headers."""
        usage = body.get("usage") if isinstance(body, Mapping) else None
        usage = usage if isinstance(usage, Mapping) else {}
        return cls(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")),
                   _amount(headers.get(COST_HEADER)))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _amount(value: str | None) -> float | None:
    try:
        amount = float(value) if value is not None else None
    except ValueError:
        return None
    return amount if amount is not None and math.isfinite(amount) and amount >= 0 else None


# How a refusal's message names a minute's budget: OpenAI's "on requests per min (RPM)", a
# gateway's "RPM limit=120" (LiteLLM's proxy, which sends no rate-limit headers with its 429).
_BUDGET_WORDS = {REQUESTS: re.compile(r"\brpm\b|requests per min", re.IGNORECASE),
                 TOKENS: re.compile(r"\btpm\b|tokens per min", re.IGNORECASE)}


def refusal_kind(body: bytes, headers: Mapping[str, str]) -> str:
    """What a 429 says ran out: `requests` or `tokens` (a minute's budget, said by the error's
    `type` as OpenAI-compatible APIs give it, by its message, or by a remaining count of 0 in
    the rate-limit headers), else `concurrency` (a service full of calls at once)."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    kind = error.get("type") if isinstance(error, dict) else None
    if kind in (REQUESTS, TOKENS, CONCURRENCY):
        return kind
    if isinstance(error, dict) and FLEX_SHORT in (kind, error.get("code")):
        return FLEX_SHORT
    message = str(error.get("message", "")) if isinstance(error, dict) else ""
    for kind, words in _BUDGET_WORDS.items():
        if words.search(message):
            return kind
    for kind in (REQUESTS, TOKENS):
        if headers.get(f"x-ratelimit-remaining-{kind}", "").strip() in ("0", "0.0"):
            return kind
    return CONCURRENCY


@dataclass(frozen=True)
class Reply:
    """What one POST came back with."""

    status: int | None
    body: dict
    outcome: str
    retry_after_s: float | None = None
    refusal: str | None = None  # a 429's kind (refusal_kind)
    headers: Mapping[str, str] = field(default_factory=dict)
