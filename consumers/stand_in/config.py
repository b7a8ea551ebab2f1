"""The stand-in's configuration: how each endpoint behaves (`EndpointConfig`, from a spec's
`stand_in` and its latency, with run-time settings over it), the provider accounts endpoints share
a meter on (`AccountConfig`, from a spec's quota) and the whole service's (`ServiceConfig`),
checked when built: a mistake is a `ConfigError`, answered 400 over HTTP."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from consumers.config.pipeline_spec import EndpointSpec, PipelineSpec, load_quota
from consumers.stand_in.budgets import TOKEN_KINDS

DISTRIBUTIONS = ("fixed", "uniform", "lognormal")
# What the spec fixes: routing, answers and the account metered.
SPEC_SETTINGS = ("path", "protocol", "required", "answers", "account")
PROTOCOLS = ("plain", "openai_chat")
CHAT_FIELDS = ("model", "user", "content")  # what a chat request offers its answer rules
# The service's own paths (consumers.stand_in.server's routes); an endpoint may not take one.
STATS, STATS_RESET, CONFIG = "/v1/stats", "/v1/stats/reset", "/v1/config"
HEALTH, METRICS = "/healthz", "/metrics"
FILES, BATCHES = "/v1/files", "/v1/batches"  # OpenAI's Batch API (consumers.stand_in.batches)
SERVICE_PATHS = (STATS, STATS_RESET, CONFIG, HEALTH, METRICS, FILES, BATCHES)


class ConfigError(ValueError):
    """A configuration the service refuses (answered 400 when it comes over HTTP)."""


def _number(name: str, value: Any, minimum: float = 0.0, maximum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"[{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{name} must be in {bounds}, got {value!r}")


def _positive(name: str, value: Any) -> None:
    """A limit: a positive integer, or None for not metered."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{name} must be a positive integer or null, got {value!r}")


def _token_kind(value: Any) -> None:
    if value not in TOKEN_KINDS:
        raise ConfigError(f"tokens must be one of {TOKEN_KINDS}, got {value!r}")


def _placeholders(template: str) -> set[str]:
    """The request fields a body template names (`{request_id}` -> request_id)."""
    try:
        return {re.split(r"[.\[]", name, maxsplit=1)[0]
                for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ConfigError(f"answer template {template!r}: {exc}") from None


def route_key(path: str) -> str:
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
    hang_rate: float = 0.0  # fraction answered (and served) only after hang_s (checked before errors)
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
    account: str | None = None  # the provider account whose meter it shares (ServiceConfig.accounts)
    # OpenAI's flex tier, a chat request's `service_tier: flex`: slower, and refused when short
    flex_slowdown: float = 2.0  # a flex call's latency over a realtime one's
    flex_refuse_rate: float = 0.0  # share of flex calls refused (429 resource_unavailable)

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
        _number("flex_slowdown", self.flex_slowdown)
        _number("flex_refuse_rate", self.flex_refuse_rate, maximum=1.0)
        if self.retry_after_s is not None:
            _number("retry_after_s", self.retry_after_s)
        if self.rate_limit_rps is not None:
            _number("rate_limit_rps", self.rate_limit_rps)
            if self.rate_limit_rps <= 0:
                raise ConfigError(f"rate_limit_rps must be positive or null, got {self.rate_limit_rps!r}")
        if isinstance(self.rate_burst, bool) or not isinstance(self.rate_burst, int) or self.rate_burst < 1:
            raise ConfigError(f"rate_burst must be an integer >= 1, got {self.rate_burst!r}")
        _number("per_output_token_s", self.per_output_token_s)
        _positive("requests_per_minute", self.requests_per_minute)
        _positive("tokens_per_minute", self.tokens_per_minute)
        _token_kind(self.tokens)
        if not isinstance(self.retry_after_on_budget, bool):
            raise ConfigError(f"retry_after_on_budget must be a boolean, got {self.retry_after_on_budget!r}")
        if self.account is not None and not (isinstance(self.account, str) and self.account):
            raise ConfigError(f"account must be a non-empty string or null, got {self.account!r}")

    @classmethod
    def from_spec(cls, spec: EndpointSpec) -> EndpointConfig:
        """The endpoint a spec declares, as the stand-in serves it; its `quota`, when the spec has
        one, names its account."""
        latency, stand_in = spec.latency, spec.stand_in
        if stand_in is None:
            raise ConfigError(f"endpoint {spec.path} has no stand_in: a real API only")
        return cls(path=spec.path, protocol=stand_in.protocol, model=spec.model,
                   required=tuple(stand_in.required),
                   answers=tuple({"when": dict(a.when), "body": dict(a.body)} for a in stand_in.answers),
                   latency_s=latency.median_s, limit=spec.concurrency, distribution=latency.distribution,
                   sigma=latency.sigma, per_output_token_s=latency.per_output_token_s,
                   requests_per_minute=spec.requests_per_minute, tokens_per_minute=spec.tokens_per_minute,
                   tokens=spec.tokens, account=getattr(spec, "quota", None))

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


@dataclass(frozen=True, kw_only=True)
class AccountConfig:
    """A provider account (an organization's key): providers meter per account and model, not
    per path, so every endpoint naming it shares one meter. `concurrency` bounds its calls at once
    across those endpoints; the per-minute budgets and `tokens` are metered as an endpoint's are.
    None: not metered (its callers are counted all the same)."""

    name: str
    concurrency: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens: str = "total"  # which tokens tokens_per_minute meters: input | output | total

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"an account's name must be a non-empty string, got {self.name!r}")
        _positive("concurrency", self.concurrency)
        _positive("requests_per_minute", self.requests_per_minute)
        _positive("tokens_per_minute", self.tokens_per_minute)
        _token_kind(self.tokens)

    @classmethod
    def from_quota(cls, quota: Any) -> AccountConfig:
        """The account a pipeline spec's quota declares: a `QuotaSpec`, or anything with its
        `name`, `concurrency`, `requests_per_minute`, `tokens_per_minute` and `tokens`."""
        return cls(name=quota.name, concurrency=quota.concurrency,
                   requests_per_minute=quota.requests_per_minute, tokens_per_minute=quota.tokens_per_minute,
                   tokens=quota.tokens)


# Endpoint names that would be ambiguous in /v1/stats or in a PUT /v1/config body.
RESERVED_NAMES = frozenset({"service", "accounts", "batches", "endpoint", "time_scale",
                            *(f.name for f in fields(EndpointConfig))})


@dataclass(frozen=True)
class ServiceConfig:
    """The whole service: its endpoints and their accounts, each by name, the time scale,
    optional bearer token and RNG seed."""

    endpoints: Mapping[str, EndpointConfig]
    time_scale: float = 1.0
    token: str | None = field(default=None, repr=False)
    seed: int | None = None
    accounts: Mapping[str, AccountConfig] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_time_scale(self.time_scale)
        if not self.endpoints:
            raise ConfigError("no endpoints to serve")
        reserved = sorted(RESERVED_NAMES.intersection(self.endpoints))
        if reserved:
            raise ConfigError(f"endpoint names {reserved} are reserved (stats and settings use them)")
        taken = sorted(c.path for c in self.endpoints.values() if route_key(c.path) in SERVICE_PATHS)
        if taken:
            raise ConfigError(f"paths {taken} are the service's own")
        _refuse_shared_paths((repr(name), config) for name, config in self.endpoints.items())
        misnamed = sorted(name for name, account in self.accounts.items() if account.name != name)
        if misnamed:
            raise ConfigError(f"accounts {misnamed} are listed under another name than their own")
        for name, config in self.endpoints.items():
            if config.account is not None and config.account not in self.accounts:
                raise ConfigError(f"endpoint {name!r} names account {config.account!r}, which is not one of "
                                  f"the accounts {sorted(self.accounts)}")

    @classmethod
    def from_specs(cls, specs: Iterable[PipelineSpec], time_scale: float = 1.0, token: str | None = None,
                   seed: int | None = None, quotas: Mapping[str, Any] | None = None,
                   **overrides: Any) -> ServiceConfig:
        """Every endpoint the specs declare a `stand_in` for, with `overrides` (EndpointConfig
        settings) applied to all, and the accounts of the quotas their endpoints name
        (`AccountConfig.from_quota`): those of `quotas` (`QuotaSpec`-like, by name), else the
        quota files'.

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
        named = sorted({config.account for _, config in declared.values() if config.account})
        quotas = quotas if quotas is not None else {name: load_quota(name) for name in named}
        named = [name for name in named if name in quotas]
        return cls({name: replace(config, **overrides) for name, (_, config) in declared.items()},
                   time_scale=time_scale, token=token, seed=seed,
                   accounts={name: AccountConfig.from_quota(quotas[name]) for name in named})


def _refuse_shared_paths(labelled: Iterable[tuple[str, EndpointConfig]]) -> None:
    """Requests are routed by path, then chat requests by their model: two endpoints share a
    path only when both are chat endpoints of different models."""
    by_path: dict[str, list[tuple[str, str | None]]] = {}
    for label, config in labelled:
        by_path.setdefault(route_key(config.path), []).append((label, config.model))
    for path, sharing in by_path.items():
        models = [model for _, model in sharing]
        if len(sharing) > 1 and (None in models or len(set(models)) < len(models)):
            raise ConfigError(f"{' and '.join(label for label, _ in sharing)} both serve POST {path} "
                              "(chat endpoints share a path only with a different model each)")


def check_time_scale(value: Any) -> None:
    _number("time_scale", value)
    if value <= 0:
        raise ConfigError(f"time_scale must be positive, got {value!r}")
