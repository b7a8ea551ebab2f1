"""Stand-in for the external AI APIs, served over HTTP for tests and benchmarks.

Consumers call it exactly as they would a real endpoint, so the pipeline's timeouts, retries
and concurrency limits are exercised for real. It serves every endpoint the pipeline specs
(`pipelines/*.yaml`) declare, at the spec's path (`POST /v1/check`, `POST /v1/moderate`, ...),
with the spec's concurrency limit (429 with `Retry-After` beyond it), its latency (fixed, or
lognormal with the spec's median and p99) and its `stand_in` rules: the request fields that must
be non-empty strings and the answers, the first rule whose patterns match supplying the body. A
global time-scale factor shrinks every duration so a test can run a scenario at 0.1x or 0.02x.

Faults are injected per endpoint (`error_rate`: 500 after the latency; `hang_rate`: sleep
`hang_s`, past any sane client timeout, then 504; `fail_when`: 500 after the latency to every
request whose fields match all of its `{field: regex}` patterns, while the rest are served, as
an endpoint does that keeps failing some requests) and can be switched at run time through
`PUT /v1/config`, so a test can start an error burst and clear it. A request-rate limit
(`rate_limit_rps`, a token bucket of `rate_burst` requests, as real APIs meter requests per
minute) answers 429 with the time until the next token as `Retry-After`; switching it on for
a few seconds makes the 429 bursts a shared quota produces. A `limit_schedule` of
`[[at_s, limit], ...]` (real-scale seconds since the setting was applied) changes the
concurrency limit during a run, as a provider's does with its load, so a client that adapts
can be measured; `limit_in_force` in the stats says which holds.

Budgets meter like a provider (`consumers.ai_budgets`): `requests_per_minute` and
`tokens_per_minute` (of the `tokens` that count: input, output or total) are continuously
refilled buckets checked before the concurrency limit. A request is charged its prompt's tokens
plus `max_tokens` (else its answer's) and corrected to the actual tokens once answered; a
refusal is 429 with an OpenAI error of type `requests` or `tokens` (a concurrency refusal says
`concurrency`) and a `Retry-After` (none with `retry_after_on_budget: false`, as LiteLLM's proxy
answers). Every answer of a budgeted endpoint carries OpenAI's `x-ratelimit-*` headers. An
endpoint whose `stand_in` says `protocol: openai_chat` speaks OpenAI's chat completions
(`messages` in, `choices` and `usage` out) and takes a time to first token (the spec's latency)
plus `per_output_token_s` per token it writes.

`GET /v1/stats` reports what was served per endpoint name, including the highest concurrency
seen (how tests verify that a consumer fleet never exceeds the API's limit), the refusals by
kind (`rejected_429`, `rate_limited`, `rate_limited_requests`, `rate_limited_tokens`), the
tokens served (`tokens_input`, `tokens_output`) and how many requests were served more than
once (`duplicate_served`: the calls a client paid for twice, counted on the service's side). A
request's identity is its endpoint's first required field (`request_id`, `message_id`, ...),
or a chat request's `user`.

    python -m consumers.ai_service --pipelines all --time-scale 0.1 --port 8600
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import random
import re
import signal
import socket
import string
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from consumers.ai_budgets import TOKEN_KINDS, Budgets, metered
from consumers.pipeline_spec import EndpointSpec, PipelineSpec, SpecError, available, load
from consumers.rate_budget import tokens_of

log = logging.getLogger(__name__)

DISTRIBUTIONS = ("fixed", "uniform", "lognormal")
COUNTERS = ("served", "rejected_429", "rate_limited", "rate_limited_requests", "rate_limited_tokens",
            "errors_5xx", "hangs", "unauthorized", "bad_requests")  # request outcomes
TOKEN_COUNTERS = ("tokens_input", "tokens_output")  # actual tokens of served answers
SPEC_SETTINGS = ("path", "protocol", "required", "answers")  # what the spec fixes: routing and answers
PROTOCOLS = ("plain", "openai_chat")
CHAT_FIELDS = ("model", "user", "content")  # what a chat request offers its answer rules
MAX_BODY_BYTES = 1024 * 1024
DEFAULT_TOKEN_ENV = "AI_SERVICE_TOKEN"


class ConfigError(ValueError):
    """A configuration the service refuses (answered 400 when it comes over HTTP)."""


def _number(name: str, value: Any, minimum: float = 0.0, maximum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"[{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{name} must be in {bounds}, got {value!r}")


def _placeholders(template: str) -> set[str]:
    """The request fields a body template names (`{request_id}` -> request_id)."""
    try:
        return {re.split(r"[.\[]", name, maxsplit=1)[0]
                for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ConfigError(f"answer template {template!r}: {exc}") from None


def _route_key(path: str) -> str:
    """A path as the router compares it: without trailing slashes."""
    return path.rstrip("/") or "/"


@dataclass(frozen=True, kw_only=True)
class EndpointConfig:
    """How one AI endpoint behaves; durations are real-scale seconds (the time scale applies).

    `path`, `protocol`, `required` and `answers` come from the spec's `stand_in` and stay plain
    tuples and dicts so /v1/stats can show them; `answers` are {"when": {field: regex}, "body": {...}}.
    """

    path: str
    protocol: str = "plain"  # plain | openai_chat (OpenAI's chat completions request and answer)
    # openai_chat: the model it serves; chat endpoints on one path are told apart by it, as a
    # provider serves every model on /v1/chat/completions.
    model: str | None = None
    required: tuple[str, ...] = ()  # non-empty string fields; the first is the request's identity
    answers: tuple[dict[str, Any], ...]
    latency_s: float = 0.5  # the median for lognormal
    limit: int = 64  # requests served at once; more are answered 429
    distribution: str = "fixed"  # fixed | uniform (latency ± jitter) | lognormal (median = latency)
    jitter: float = 0.2  # uniform: fraction of the latency either side
    sigma: float = 0.25  # lognormal: shape, ln(p99 / median) / z(0.99)
    error_rate: float = 0.0  # fraction answered 500 after the latency
    hang_rate: float = 0.0  # fraction that sleep hang_s then answer 504 (checked before errors)
    hang_s: float = 30.0
    retry_after_s: float | None = None  # Retry-After on 429; None means the latency
    rate_limit_rps: float | None = None  # requests per real-scale second; None: no rate limit
    rate_burst: int = 1  # token bucket size: requests admitted back to back at the full rate
    limit_schedule: tuple[tuple[float, int], ...] = ()  # (at_s, limit): `limit` from at_s on
    fail_when: Mapping[str, str] = field(default_factory=dict)  # {field: regex}: 500 when all match
    per_output_token_s: float = 0.0  # generation time per output token, after the drawn latency
    requests_per_minute: int | None = None  # a continuously refilled budget; None: not metered
    tokens_per_minute: int | None = None
    tokens: str = "total"  # which tokens tokens_per_minute meters: input | output | total
    retry_after_on_budget: bool = True  # False: budget refusals carry no Retry-After (as LiteLLM's)

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit_schedule", _schedule(self.limit_schedule))
        object.__setattr__(self, "fail_when", _patterns("fail_when", self.fail_when))
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise ConfigError(f"path must start with '/', got {self.path!r}")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.model is not None and not (self.chat and isinstance(self.model, str) and self.model):
            raise ConfigError(f"{self.path}: only an openai_chat endpoint names a model (a non-empty string)")
        if not self.answers:
            raise ConfigError(f"{self.path}: at least one answer rule is needed")
        offered = set(self.required) | (set(CHAT_FIELDS) if self.chat else set())
        for rule in self.answers:
            _patterns(f"{self.path}: when", rule["when"])
            if self.chat and not isinstance(rule["body"].get("content"), str):
                raise ConfigError(f"{self.path}: a chat answer needs a `content` string (the text)")
            templates = [v for v in rule["body"].values() if isinstance(v, str)]
            unknown = sorted(set().union(*map(_placeholders, templates)) - offered)
            if unknown:
                raise ConfigError(f"{self.path}: an answer names {unknown}, which are not required fields")
        _number("latency_s", self.latency_s)
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            raise ConfigError(f"limit must be a non-negative integer, got {self.limit!r}")
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError(f"distribution must be one of {DISTRIBUTIONS}, got {self.distribution!r}")
        _number("jitter", self.jitter, maximum=1.0)
        _number("sigma", self.sigma)
        _number("error_rate", self.error_rate, maximum=1.0)
        _number("hang_rate", self.hang_rate, maximum=1.0)
        _number("hang_s", self.hang_s)
        if self.retry_after_s is not None:
            _number("retry_after_s", self.retry_after_s)
        if self.rate_limit_rps is not None:
            _number("rate_limit_rps", self.rate_limit_rps)
            if self.rate_limit_rps <= 0:
                raise ConfigError(f"rate_limit_rps must be positive or null, got {self.rate_limit_rps!r}")
        if isinstance(self.rate_burst, bool) or not isinstance(self.rate_burst, int) or self.rate_burst < 1:
            raise ConfigError(f"rate_burst must be an integer >= 1, got {self.rate_burst!r}")
        _number("per_output_token_s", self.per_output_token_s)
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive integer or null, got {value!r}")
        if self.tokens not in TOKEN_KINDS:
            raise ConfigError(f"tokens must be one of {TOKEN_KINDS}, got {self.tokens!r}")
        if not isinstance(self.retry_after_on_budget, bool):
            raise ConfigError(f"retry_after_on_budget must be a boolean, got {self.retry_after_on_budget!r}")

    @classmethod
    def from_spec(cls, spec: EndpointSpec) -> EndpointConfig:
        """The endpoint a spec declares, as the stand-in serves it."""
        latency, stand_in = spec.latency, spec.stand_in
        if stand_in is None:
            raise ConfigError(f"endpoint {spec.path} has no stand_in: a real API only")
        return cls(path=spec.path, protocol=stand_in.protocol, model=spec.model,
                   required=tuple(stand_in.required),
                   answers=tuple({"when": dict(a.when), "body": dict(a.body)} for a in stand_in.answers),
                   latency_s=latency.median_s, limit=spec.concurrency, distribution=latency.distribution,
                   sigma=latency.sigma, per_output_token_s=latency.per_output_token_s,
                   requests_per_minute=spec.requests_per_minute, tokens_per_minute=spec.tokens_per_minute,
                   tokens=spec.tokens)

    @property
    def chat(self) -> bool:
        return self.protocol == "openai_chat"

    @property
    def identity(self) -> str | None:
        """The field duplicates are counted on: `user` for chat, else the first required one."""
        if self.chat:
            return "user"
        return self.required[0] if self.required else None

    @property
    def budgeted(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute)

    @property
    def retry_after(self) -> float:
        return self.latency_s if self.retry_after_s is None else self.retry_after_s

    def limit_at(self, elapsed_s: float) -> int:
        """The concurrency limit `elapsed_s` real-scale seconds after this config was applied."""
        in_force = self.limit
        for at_s, limit in self.limit_schedule:
            if elapsed_s >= at_s:
                in_force = limit
        return in_force


def _patterns(name: str, value: Any) -> dict[str, str]:
    """`{field: regex}` patterns (a copy), each checked to compile."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be an object of field: regex, got {value!r}")
    for key, pattern in value.items():
        if not isinstance(pattern, str):
            raise ConfigError(f"{name}.{key} must be a regex string, got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{name}.{key} is not a regex: {exc}") from None
    return dict(value)


def matches(patterns: Mapping[str, str], payload: Mapping[str, Any]) -> bool:
    """Every pattern finds a match in its request field, a string (a missing field counts as
    empty, any other value as no match)."""
    return all(isinstance(value := payload.get(name, ""), str) and re.search(pattern, value) is not None
               for name, pattern in patterns.items())


def _schedule(value: Any) -> tuple[tuple[float, int], ...]:
    """A limit schedule as pairs (at_s >= 0, limit >= 0) in time order (JSON gives lists)."""
    try:
        pairs = tuple((at_s, limit) for at_s, limit in value)
    except (TypeError, ValueError):
        raise ConfigError(f"limit_schedule must be a list of [at_s, limit] pairs, got {value!r}") from None
    for at_s, limit in pairs:
        _number("limit_schedule at_s", at_s)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigError(f"limit_schedule limits must be non-negative integers, got {limit!r}")
    if [at for at, _ in pairs] != sorted(at for at, _ in pairs):
        raise ConfigError(f"limit_schedule must be in time order, got {value!r}")
    return pairs


# Endpoint names that would be ambiguous in /v1/stats or in a PUT /v1/config body.
RESERVED_NAMES = frozenset({"service", "endpoint", "time_scale", *(f.name for f in fields(EndpointConfig))})


@dataclass(frozen=True)
class ServiceConfig:
    """The whole service: its endpoints by name, the time scale, optional bearer token and RNG seed."""

    endpoints: Mapping[str, EndpointConfig]
    time_scale: float = 1.0
    token: str | None = field(default=None, repr=False)
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_time_scale(self.time_scale)
        if not self.endpoints:
            raise ConfigError("no endpoints to serve")
        reserved = sorted(RESERVED_NAMES.intersection(self.endpoints))
        if reserved:
            raise ConfigError(f"endpoint names {reserved} are reserved (stats and settings use them)")
        taken = sorted(c.path for c in self.endpoints.values() if _route_key(c.path) in ROUTES)
        if taken:
            raise ConfigError(f"paths {taken} are the service's own")
        _refuse_shared_paths((repr(name), config) for name, config in self.endpoints.items())

    @classmethod
    def from_specs(cls, specs: Iterable[PipelineSpec], time_scale: float = 1.0, token: str | None = None,
                   seed: int | None = None, **overrides: Any) -> ServiceConfig:
        """Every endpoint the specs declare a `stand_in` for, with `overrides` (EndpointConfig
        settings) applied to all.

        Specs may share an endpoint when they declare it alike; one name or one path declared
        two ways is refused, naming both specs.
        """
        declared: dict[str, tuple[str, EndpointConfig]] = {}  # name -> (first spec, config)
        for spec in specs:
            for name, endpoint in spec.endpoints.items():
                if endpoint.stand_in is None:  # a real API only
                    continue
                config = EndpointConfig.from_spec(endpoint)
                first, known = declared.setdefault(name, (spec.name, config))
                if known != config:
                    raise ConfigError(f"endpoint {name!r} is declared differently by {first} and {spec.name}")
        _refuse_shared_paths((f"{first}.{name}", config) for name, (first, config) in declared.items())
        return cls({name: replace(config, **overrides) for name, (_, config) in declared.items()},
                   time_scale=time_scale, token=token, seed=seed)


def _refuse_shared_paths(labelled: Iterable[tuple[str, EndpointConfig]]) -> None:
    """Requests are routed by path, then chat requests by their model: two endpoints share a
    path only when both are chat endpoints of different models."""
    by_path: dict[str, list[tuple[str, str | None]]] = {}
    for label, config in labelled:
        by_path.setdefault(_route_key(config.path), []).append((label, config.model))
    for path, sharing in by_path.items():
        models = [model for _, model in sharing]
        if len(sharing) > 1 and (None in models or len(set(models)) < len(models)):
            raise ConfigError(f"{' and '.join(label for label, _ in sharing)} both serve POST {path} "
                              "(chat endpoints share a path only with a different model each)")


def _check_time_scale(value: Any) -> None:
    _number("time_scale", value)
    if value <= 0:
        raise ConfigError(f"time_scale must be positive, got {value!r}")


def sample_latency(config: EndpointConfig, rng: random.Random) -> float:
    """One real-scale latency drawn from the endpoint's distribution (lognormal: latency is the median)."""
    if config.distribution == "uniform":
        return max(0.0, config.latency_s * rng.uniform(1 - config.jitter, 1 + config.jitter))
    if config.distribution == "lognormal":
        return config.latency_s * rng.lognormvariate(0.0, config.sigma)
    return config.latency_s


@dataclass(frozen=True)
class Reply:
    """What the handler sends back: status, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


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


class Endpoint:
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
        self._tokens = float(config.rate_burst)
        self._refilled_at = clock()
        self._applied_at = clock()  # when the config in force was applied (its schedule's zero)
        self._budgets = Budgets(config.requests_per_minute, config.tokens_per_minute, clock())

    @property
    def config(self) -> EndpointConfig:
        with self._lock:
            return self._config

    def reconfigure(self, config: EndpointConfig) -> None:
        """A new config; a changed rate limit or budget starts from a full bucket, as a new quota would."""
        with self._lock:
            if (config.rate_limit_rps, config.rate_burst) != (self._config.rate_limit_rps,
                                                              self._config.rate_burst):
                self._tokens, self._refilled_at = float(config.rate_burst), self._clock()
            if config.limit_schedule != self._config.limit_schedule:
                self._applied_at = self._clock()
            if _budget_of(config) != _budget_of(self._config):
                self._budgets = Budgets(config.requests_per_minute, config.tokens_per_minute, self._clock())
            self._config = config

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

    def admit(self, scale: float, input_tokens: int = 0, output_tokens: int = 0) -> EndpointConfig | Refusal:
        """Pass the budgets, the rate limit and take a concurrency slot, returning the config in
        force, or count a 429 and say when to retry (atomic). Budgets and the rate limit are
        checked first, as an API gateway meters requests before they reach the model servers;
        the token budget charges the request's estimated tokens (`output_tokens` is its
        estimate). A refused request takes nothing from any bucket."""
        with self._lock:
            config = self._config
            now = self._clock()
            tokens = metered(config.tokens, input_tokens, output_tokens)
            self._budgets.refill(now, scale)
            short = self._budgets.shortfall(tokens, scale)
            if short is not None:
                counter = f"rate_limited_{short.kind}"
                self._counts[counter] += 1
                wait = short.wait_s if config.retry_after_on_budget else None
                return Refusal(counter, wait, short.message, self._budgets.headers(scale))
            if config.rate_limit_rps is not None:
                rate = config.rate_limit_rps / scale  # tokens per wall-clock second
                self._tokens = min(config.rate_burst, self._tokens + (now - self._refilled_at) * rate)
                self._refilled_at = now
                if self._tokens < 1:
                    self._counts["rate_limited"] += 1
                    return Refusal("rate_limited", (1 - self._tokens) / rate, "request rate limit reached",
                                   self._budgets.headers(scale))
            if self._in_flight >= config.limit_at((now - self._applied_at) / scale):
                self._counts["rejected_429"] += 1
                return Refusal("rejected_429", config.retry_after * scale, "too many concurrent requests",
                               self._budgets.headers(scale))
            if config.rate_limit_rps is not None:
                self._tokens -= 1
            self._budgets.take(tokens)
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            return config

    def release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def correct(self, admitted: EndpointConfig, input_tokens: int, estimate: int, actual: int,
                scale: float) -> None:
        """Replace the output tokens estimated at admission with the answer's actual ones (unless
        the budget was changed meanwhile: a new budget never took the charge)."""
        with self._lock:
            if _budget_of(admitted) == _budget_of(self._config):
                self._budgets.correct(metered(admitted.tokens, input_tokens, estimate),
                                      metered(admitted.tokens, input_tokens, actual), self._clock(), scale)

    def budget_headers(self, scale: float) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers as the budgets stand now (empty without budgets)."""
        with self._lock:
            self._budgets.refill(self._clock(), scale)
            return self._budgets.headers(scale)

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
        """Zero the counters; the peak restarts from the requests still in flight."""
        with self._lock:
            self._counts = dict.fromkeys(COUNTERS + TOKEN_COUNTERS, 0)
            self._served.clear()
            self._max_in_flight = self._in_flight

    def snapshot(self, scale: float) -> dict[str, Any]:
        with self._lock:
            distinct = len(self._served)
            return {**self._counts, "distinct_served": distinct,
                    "duplicate_served": self._served.total() - distinct,
                    "in_flight": self._in_flight, "max_in_flight": self._max_in_flight,
                    "limit_in_force": self._config.limit_at((self._clock() - self._applied_at) / scale),
                    "config": asdict(self._config)}


def _budget_of(config: EndpointConfig) -> tuple[int | None, int | None, str]:
    """The settings a budget's buckets are made from: changing one starts a new quota."""
    return config.requests_per_minute, config.tokens_per_minute, config.tokens


class BadRequest(ValueError):
    """A request body the endpoint cannot answer (400)."""


def _decode(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise BadRequest("body must be a JSON object")
    return payload


def _check_fields(config: EndpointConfig, payload: Mapping[str, Any]) -> None:
    """The required fields non-empty strings, the ones an answer rule matches strings when present."""
    for name in config.required:
        if not isinstance(payload.get(name), str) or not payload[name]:
            raise BadRequest(f"{name} must be a non-empty string")
    for name in {name for rule in config.answers for name in rule["when"]}:
        if not isinstance(payload.get(name, ""), str):
            raise BadRequest(f"{name} must be a string")


def _max_tokens(payload: Mapping[str, Any]) -> int | None:
    value = payload.get("max_tokens")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise BadRequest("max_tokens must be a positive integer")
    return value


def parse_request(config: EndpointConfig, body: bytes) -> dict[str, Any]:
    """The JSON body, checked for the fields the endpoint's spec insists on."""
    payload = _decode(body)
    _check_fields(config, payload)
    _max_tokens(payload)
    return payload


def parse_chat(body: bytes) -> tuple[dict[str, Any], str]:
    """An OpenAI chat completions request: the fields its answer rules see (`model`, `user` and
    the last user message as `content`, plus `max_tokens` when given) and its whole prompt text."""
    payload = _decode(body)
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    for message in messages:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise BadRequest("each message must have a string role and a string content")
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users:
        raise BadRequest("messages must include a user message")
    for name in ("model", "user"):
        if not isinstance(payload.get(name), str) or not payload[name]:
            raise BadRequest(f"{name} must be a non-empty string")
    temperature = payload.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, int | float)
                                    or not 0 <= temperature <= 2):
        raise BadRequest("temperature must be a number in [0, 2]")
    fields = {"model": payload["model"], "user": payload["user"], "content": users[-1]}
    max_tokens = _max_tokens(payload)
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    return fields, "".join(m["content"] for m in messages)


def _echo(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The request id sent back with every answer, as the reference APIs do, when there is one."""
    return {"request_id": payload["request_id"]} if "request_id" in payload else {}


def answer(config: EndpointConfig, payload: dict[str, Any]) -> dict[str, Any]:
    """The body of the first answer rule whose patterns all match the request, formatted with the
    request's fields; a request no rule matches is refused, so a spec's gap shows as bad_requests."""
    for rule in config.answers:
        if matches(rule["when"], payload):
            body = {k: v.format_map(payload) if isinstance(v, str) else v for k, v in rule["body"].items()}
            return {**_echo(payload), **body}
    raise BadRequest("no answer rule of the endpoint matches the request")


def _strings(values: Iterable[Any]) -> str:
    return "".join(v for v in values if isinstance(v, str))


@dataclass(frozen=True)
class Call:
    """One valid request and the answer it gets, with the tokens both take: what the budgets
    charge at admission (`max_tokens`, else the answer's) and what they are corrected to."""

    payload: dict[str, Any]  # the fields answer rules, fail_when and the identity read
    body: dict[str, Any]  # the 200 answer
    input_tokens: int
    output_tokens: int  # the answer's actual tokens
    max_tokens: int | None = None

    @property
    def output_estimate(self) -> int:
        return self.output_tokens if self.max_tokens is None else self.max_tokens


def prepare(config: EndpointConfig, body: bytes) -> Call:
    """Parse a request as its endpoint's protocol reads it and make its answer (raises BadRequest).

    A plain request's prompt is its string fields and its answer's tokens the answer body's
    strings; a chat answer is the rule's `content`, cut to `max_tokens` (finish_reason `length`)."""
    if not config.chat:
        payload = parse_request(config, body)
        result = answer(config, payload)
        return Call(payload, result, tokens_of(_strings(payload.values())),
                    tokens_of(_strings(result.values())), payload.get("max_tokens"))
    fields, prompt = parse_chat(body)
    _check_fields(config, fields)
    text = str(answer(config, fields)["content"])
    max_tokens = fields.get("max_tokens")
    completion, finish = tokens_of(text), "stop"
    if max_tokens is not None and completion > max_tokens:
        text, completion, finish = text[:max_tokens * 4], max_tokens, "length"
    prompt_tokens = tokens_of(prompt)
    result = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
              "model": fields["model"],
              "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                           "finish_reason": finish}],
              "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                        "total_tokens": prompt_tokens + completion}}
    return Call(fields, result, prompt_tokens, completion, max_tokens)


def _refused(refusal: Refusal) -> Reply:
    """A 429 as OpenAI words it: the error's type says which limit refused (concurrency, requests
    or tokens); `Retry-After` when the refusal says when to come back."""
    code = "too_many_requests" if refusal.kind == "concurrency" else "rate_limit_exceeded"
    error = {"type": refusal.kind, "code": code, "message": refusal.message,
             "retry_after_s": refusal.retry_after_s}
    headers = dict(refusal.headers)
    if refusal.retry_after_s is not None:
        headers["Retry-After"] = _seconds(refusal.retry_after_s)
    return Reply(429, {"error": error}, headers)


def _seconds(value: float) -> str:
    """A Retry-After value: seconds, fractional when the time scale makes it so."""
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"


class StandIn:
    """The service's state and behaviour, independent of HTTP so it stays easy to reason about."""

    def __init__(self, config: ServiceConfig) -> None:
        self.endpoints = {name: Endpoint(name, endpoint, config.seed)
                          for name, endpoint in config.endpoints.items()}
        self._time_scale = config.time_scale
        self._token = config.token
        self._seed = config.seed
        self._config_lock = threading.Lock()
        self.stopping = threading.Event()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    @property
    def time_scale(self) -> float:
        return self._time_scale

    def authorized(self, authorization: str | None) -> bool:
        if not self._token:
            return True
        expected = f"Bearer {self._token}".encode()
        return hmac.compare_digest((authorization or "").encode(), expected)

    def call(self, name: str, authorization: str | None, body: bytes) -> Reply:
        """One AI request: auth, validation, a concurrency slot, the latency, then the outcome."""
        endpoint = self.endpoints[name]
        if not self.authorized(authorization):
            endpoint.count("unauthorized")
            return Reply(401, {"error": "unauthorized"}, {"WWW-Authenticate": "Bearer"})
        declared = endpoint.config  # its path, protocol, fields and answers never change at run time
        try:
            call = prepare(declared, body)
        except BadRequest as exc:
            endpoint.count("bad_requests")
            return Reply(400, {"error": "bad_request", "detail": str(exc)})
        scale = self.time_scale
        config = endpoint.admit(scale, call.input_tokens, call.output_estimate)
        if isinstance(config, Refusal):
            return _refused(config)
        try:
            reply = self._serve(endpoint, config, scale, call)
        finally:
            endpoint.release()
        if config.budgeted:
            reply = replace(reply, headers={**reply.headers, **endpoint.budget_headers(scale)})
        return reply

    def _serve(self, endpoint: Endpoint, config: EndpointConfig, scale: float, call: Call) -> Reply:
        """The latency, then the outcome; an answer also takes its time per output token, and its
        actual tokens replace the estimate charged (a failed call keeps its charge, as providers count
        failed requests too)."""
        payload = call.payload
        outcome, duration = endpoint.plan(config, payload)
        if outcome == "hang":
            endpoint.count("hangs")
        elif outcome == "ok":
            duration += config.per_output_token_s * call.output_tokens
        if self.stopping.wait(duration * scale):
            return Reply(503, {"error": "shutting_down"})
        if outcome == "hang":
            return Reply(504, {"error": "upstream_timeout", **_echo(payload)})
        if outcome == "error":
            endpoint.count("errors_5xx")
            return Reply(500, {"error": "internal_error", **_echo(payload)})
        endpoint.correct(config, call.input_tokens, call.output_estimate, call.output_tokens, scale)
        endpoint.served(payload[config.identity] if config.identity else None, call.input_tokens,
                        call.output_tokens)
        return Reply(200, call.body)

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = {name: ep.snapshot(self.time_scale) for name, ep in self.endpoints.items()}
        for snapshot in result.values():
            config = snapshot["config"]
            config["scaled_latency_s"] = config["latency_s"] * self.time_scale
            config["time_scale"] = self.time_scale
        result["service"] = {"time_scale": self.time_scale, "auth_required": bool(self._token),
                             "seed": self._seed}
        return result

    def reset(self) -> None:
        for endpoint in self.endpoints.values():
            endpoint.reset()

    def update(self, changes: Mapping[str, Any]) -> None:
        """Apply run-time changes all at once, or none when any is invalid (raises ConfigError)."""
        with self._config_lock:
            time_scale, configs = self._planned(dict(changes))
            for name, config in configs.items():
                self.endpoints[name].reconfigure(config)
            if time_scale is not None:
                self._time_scale = time_scale

    def _planned(self, changes: dict[str, Any]) -> tuple[float | None, dict[str, EndpointConfig]]:
        """The changes per endpoint: `{name: {...}}` for one, `endpoint: name` beside settings for
        one, settings alone for every endpoint."""
        time_scale = changes.pop("time_scale", None)
        if time_scale is not None:
            _check_time_scale(time_scale)
        names = tuple(self.endpoints)
        target = changes.pop("endpoint", None)
        if target is not None and target not in names:
            raise ConfigError(f"endpoint must be one of {names}, got {target!r}")
        per_endpoint: dict[str, dict[str, Any]] = {name: {} for name in names}
        for name in names:
            nested = changes.pop(name, {})
            if not isinstance(nested, dict):
                raise ConfigError(f"{name} must be an object of endpoint settings")
            per_endpoint[name].update(nested)
        for name in [target] if target else names:
            per_endpoint[name].update(changes)
        known = {f.name for f in fields(EndpointConfig)} - set(SPEC_SETTINGS)
        configs = {}
        for name, settings in per_endpoint.items():
            unknown = sorted(set(settings) - known)
            if unknown:
                raise ConfigError(f"unknown settings {unknown} (the spec fixes {list(SPEC_SETTINGS)}); "
                                  f"known: {sorted(known)}, time_scale and the endpoints {list(names)}")
            if settings:
                configs[name] = replace(self.endpoints[name].config, **settings)
        return time_scale, configs


class _Collector:
    """Prometheus view of the same counters as /v1/stats (so a reset shows as a counter reset)."""

    def __init__(self, standin: StandIn) -> None:
        self._standin = standin

    def collect(self) -> list[Metric]:
        requests = CounterMetricFamily("ai_service_requests", "AI requests by endpoint and outcome",
                                       labels=["endpoint", "outcome"])
        gauges = {key: GaugeMetricFamily(f"ai_service_{key}", help_text, labels=["endpoint"])
                  for key, help_text in (("in_flight", "Requests being served now"),
                                         ("max_in_flight", "Highest concurrency since the last reset"),
                                         ("limit", "Concurrency limit; beyond it requests get 429"),
                                         ("duplicate_served",
                                          "200 answers beyond the first per request since the last reset"),
                                         ("latency_seconds",
                                          "Configured (median) latency after the time scale"))}
        tokens = CounterMetricFamily("ai_service_tokens", "Actual tokens of served answers (input, output)",
                                     labels=["endpoint", "kind"])
        stats = self._standin.stats()
        for name in self._standin.endpoints:
            snapshot = stats[name]
            for counter in COUNTERS:
                requests.add_metric([name, counter], snapshot[counter])
            for counter in TOKEN_COUNTERS:
                tokens.add_metric([name, counter.removeprefix("tokens_")], snapshot[counter])
            gauges["in_flight"].add_metric([name], snapshot["in_flight"])
            gauges["max_in_flight"].add_metric([name], snapshot["max_in_flight"])
            gauges["limit"].add_metric([name], snapshot["limit_in_force"])
            gauges["duplicate_served"].add_metric([name], snapshot["duplicate_served"])
            gauges["latency_seconds"].add_metric([name], snapshot["config"]["scaled_latency_s"])
        scale = GaugeMetricFamily("ai_service_time_scale", "Factor applied to every duration",
                                  value=self._standin.time_scale)
        return [requests, tokens, *gauges.values(), scale]


class _Handler(BaseHTTPRequestHandler):
    """Routes HTTP requests to the stand-in; keep-alive so clients can pool connections.

    Nagle's algorithm is off: an answer goes out as two writes (headers, then body), and with
    Nagle on, the body waits for the client's delayed ACK of the headers, about 40 ms on Linux.
    That added 42 ms to every call here (a 10 ms call took 52 ms) and took 5 % off the AI
    capacity of a 900 ms generation; a real endpoint answers without such a stall."""

    server: AIServiceServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "ai-service-stand-in/1.0"
    timeout = 120  # idle keep-alive connections are closed after this

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        body = self._read_body()
        if body is None:
            return
        path = _route_key(urlsplit(self.path).path)
        methods = self.server.routes.get(path)
        if methods is None:
            self._send_json(Reply(404, {"error": "not_found", "path": path}))
        elif method not in methods:
            self._send_json(Reply(405, {"error": "method_not_allowed"}, {"Allow": ", ".join(methods)}))
        else:
            methods[method](self, body)

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering a body the service will not read."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            self._send_json(Reply(411, {"error": "length_required"}))
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
            self._send_json(Reply(413, {"error": "body_too_large", "max_bytes": MAX_BODY_BYTES}))
            return None
        return self.rfile.read(length) if length else b""

    @property
    def standin(self) -> StandIn:
        return self.server.standin

    def _admin_allowed(self) -> bool:
        if self.standin.authorized(self.headers.get("Authorization")):
            return True
        self._send_json(Reply(401, {"error": "unauthorized"}, {"WWW-Authenticate": "Bearer"}))
        return False

    def _ai(self, name: str, body: bytes) -> None:
        self._send_json(self.standin.call(name, self.headers.get("Authorization"), body))

    def _stats(self, _body: bytes) -> None:
        if self._admin_allowed():
            self._send_json(Reply(200, self.standin.stats()))

    def _reset(self, _body: bytes) -> None:
        if self._admin_allowed():
            self.standin.reset()
            self._send_json(Reply(200, self.standin.stats()))

    def _config(self, body: bytes) -> None:
        if not self._admin_allowed():
            return
        try:
            changes = json.loads(body or b"{}")
            if not isinstance(changes, dict):
                raise ConfigError("body must be a JSON object")
            self.standin.update(changes)
        except (ConfigError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            self._send_json(Reply(400, {"error": "bad_config", "detail": str(exc)}))
            return
        self._send_json(Reply(200, self.standin.stats()))

    def _health(self, _body: bytes) -> None:
        self._send_json(Reply(200, {"status": "ok"}))

    def _metrics(self, _body: bytes) -> None:
        self._send(200, generate_latest(self.standin.registry), CONTENT_TYPE_LATEST)

    def _send_json(self, reply: Reply) -> None:
        self._send(reply.status, json.dumps(reply.body).encode(), "application/json", reply.headers)

    def _send(self, status: int, data: bytes, content_type: str,
              headers: Mapping[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (e.g. its timeout fired first)


Route = Callable[[_Handler, bytes], None]
ROUTES: dict[str, dict[str, Route]] = {  # the service's own; each endpoint adds POST <its path>
    "/v1/stats": {"GET": _Handler._stats},
    "/v1/stats/reset": {"POST": _Handler._reset},
    "/v1/config": {"PUT": _Handler._config},
    "/healthz": {"GET": _Handler._health},
    "/metrics": {"GET": _Handler._metrics},
}


def _ai_route(names: Mapping[str | None, str]) -> Route:
    """POST to an endpoint's path: to its one endpoint, or, for chat endpoints that name their
    models, to the one whose model the request names (404 `model_not_found` for any other)."""
    def route(handler: _Handler, body: bytes) -> None:
        if None in names:
            handler._ai(names[None], body)
            return
        try:
            model = json.loads(body).get("model")
        except (ValueError, AttributeError):
            model = None
        if model in names:
            handler._ai(names[model], body)
        else:
            handler._send_json(Reply(404, {"error": {
                "type": "invalid_request_error", "code": "model_not_found",
                "message": f"model {model!r} is not served here (served: {sorted(n for n in names if n)})"}}))
    return route


def _ai_routes(endpoints: Mapping[str, Any]) -> dict[str, dict[str, Route]]:
    """The POST route of each endpoint path."""
    by_path: dict[str, dict[str | None, str]] = {}
    for name, endpoint in endpoints.items():
        by_path.setdefault(_route_key(endpoint.config.path), {})[endpoint.config.model] = name
    return {path: {"POST": _ai_route(names)} for path, names in by_path.items()}


class AIServiceServer(ThreadingHTTPServer):
    """Thread per connection; a deep accept backlog so bursts of hundreds of callers queue, not fail."""

    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], standin: StandIn) -> None:
        self.standin = standin
        self.routes = {**ROUTES, **_ai_routes(standin.endpoints)}
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def shutdown(self) -> None:
        """Stop serving and wake requests that are sleeping out a latency or a hang."""
        self.standin.stopping.set()
        super().shutdown()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("error while serving %s", client_address, exc_info=True)


def serve(config: ServiceConfig, host: str = "127.0.0.1", port: int = 8600) -> ThreadingHTTPServer:
    """Start serving in a background thread and return the server (port=0 picks a free port)."""
    server = AIServiceServer((host, port), StandIn(config))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name=f"ai-service-{server.server_address[1]}", daemon=True)
    thread.start()
    return server


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m consumers.ai_service",
                                description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--pipelines", default="all",
                   help="specs whose endpoints are served: all, or a comma list of names or paths")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    p.add_argument("--port", type=int, default=8600, help="port to bind (0 picks a free one)")
    p.add_argument("--time-scale", type=float, default=1.0, help="factor applied to every duration")
    p.add_argument("--limit", type=int, help="concurrency limit of every endpoint, instead of each spec's")
    p.add_argument("--error-rate", type=float, default=0.0, help="fraction answered 500 (every endpoint)")
    p.add_argument("--hang-rate", type=float, default=0.0, help="fraction that hang then get 504")
    p.add_argument("--hang-s", type=float, default=30.0, help="how long a hang lasts, real-scale seconds")
    p.add_argument("--token-env", default=DEFAULT_TOKEN_ENV,
                   help="environment variable holding the bearer token; unset or empty disables auth")
    p.add_argument("--seed", type=int, help="seed for latencies and injected faults (reproducible runs)")
    p.add_argument("--log-level", default="INFO", help="DEBUG logs every request")
    return p


def config_from_args(args: argparse.Namespace) -> ServiceConfig:
    """The service configuration the command line asks for (raises SpecError or ConfigError)."""
    names = available() if args.pipelines == "all" else [n.strip() for n in args.pipelines.split(",")]
    overrides: dict[str, Any] = {"error_rate": args.error_rate, "hang_rate": args.hang_rate,
                                 "hang_s": args.hang_s}
    if args.limit is not None:
        overrides["limit"] = args.limit
    return ServiceConfig.from_specs([load(name) for name in names if name], time_scale=args.time_scale,
                                    token=os.environ.get(args.token_env) or None, seed=args.seed,
                                    **overrides)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT, then stop accepting and exit 0."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = config_from_args(args)
    except (ConfigError, SpecError) as exc:
        parser.error(str(exc))
    server = serve(config, args.host, args.port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    host, port = server.server_address[:2]
    log.info("serving on %s port %s (time scale %s, auth %s, endpoints %s)", host, port, config.time_scale,
             "on" if config.token else "off",
             ", ".join(f"{name} {e.path}" for name, e in config.endpoints.items()))
    while not stop.wait(0.5):
        pass
    log.info("stopping")
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
