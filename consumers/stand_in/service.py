"""The stand-in's behaviour, independent of HTTP: a call admitted, served after its latency or
failed as injected; the stats; run-time changes of the configuration."""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from consumers.stand_in.accounts import ANONYMOUS, REFUSAL_KINDS, Account, Claim
from consumers.stand_in.batches import Batches
from consumers.stand_in.calls import BadRequest, Call, echo, prepare
from consumers.stand_in.config import (
    SPEC_SETTINGS,
    AccountConfig,
    ConfigError,
    EndpointConfig,
    ServiceConfig,
    check_time_scale,
)
from consumers.stand_in.endpoint import COUNTERS, TOKEN_COUNTERS, Refusal, SimulatedEndpoint

FLEX_REFUSED = "resource_unavailable"  # OpenAI's 429 to a flex call when capacity is short


@dataclass(frozen=True)
class Reply:
    """What the handler sends back: status, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


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
    """The service's state and behaviour, independent of HTTP so it stays easy to reason about.

    `clock` (the endpoints' and the accounts') is injectable for hand-computed times."""

    def __init__(self, config: ServiceConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.accounts = {name: Account(account, clock) for name, account in config.accounts.items()}
        self._members = {name: sorted(n for n, e in config.endpoints.items() if e.account == name)
                         for name in config.accounts}  # an endpoint's account is the spec's: fixed
        self.endpoints = {name: SimulatedEndpoint(name, endpoint, config.seed, clock)
                          for name, endpoint in config.endpoints.items()}
        self._time_scale = config.time_scale
        self._token = config.token
        self._seed = config.seed
        self._config_lock = threading.Lock()
        self.stopping = threading.Event()
        self.batches = Batches(self._by_path_and_model, lambda: self._time_scale, clock, time.time,
                               config.seed)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    @property
    def time_scale(self) -> float:
        return self._time_scale

    def _by_path_and_model(self) -> dict[tuple[str, str | None], SimulatedEndpoint]:
        """The endpoints as a batch line names one: by its url and its body's model."""
        return {(e.config.path, e.config.model): e for e in self.endpoints.values()}

    def authorized(self, authorization: str | None) -> bool:
        if not self._token:
            return True
        expected = f"Bearer {self._token}".encode()
        return hmac.compare_digest((authorization or "").encode(), expected)

    def call(self, name: str, authorization: str | None, body: bytes, caller: str = ANONYMOUS) -> Reply:
        """One AI request: auth, validation, a concurrency slot (with its account's meter, where
        `caller` is counted), the latency, then the outcome."""
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
        flex = declared.chat and call.payload.get("service_tier") == "flex"
        if flex and endpoint.refuses_flex(endpoint.config):
            endpoint.count("flex_refused")
            return Reply(429, {"error": {"type": FLEX_REFUSED, "code": FLEX_REFUSED,
                                         "message": "flex capacity is short: retry, or call realtime"}})
        scale = self.time_scale
        account = self.accounts[declared.account] if declared.account else None
        claim = account.claim(caller, call.input_tokens, call.output_estimate) if account else None
        config = endpoint.admit(scale, call.input_tokens, call.output_estimate, claim)
        if isinstance(config, Refusal):
            return _refused(config)
        try:
            reply = self._serve(endpoint, config, scale, call, claim, flex)
        finally:
            endpoint.release()
            if claim is not None:
                claim.account.release(claim)
        headers = endpoint.budget_headers(scale) if config.budgeted else {}
        if claim is not None:  # the account's buckets over the endpoint's: what remains for everyone
            headers.update(claim.account.headers(scale))
        return replace(reply, headers={**reply.headers, **headers})

    def _serve(self, endpoint: SimulatedEndpoint, config: EndpointConfig, scale: float, call: Call,
               claim: Claim | None, flex: bool = False) -> Reply:
        """The latency, then the outcome; an answer also takes its time per output token, and its
        actual tokens replace the estimate charged (a failed call keeps its charge, as providers count
        failed requests too). A hang is an answer that takes `hang_s`: served, and counted as served,
        whether its caller still waits for it or not, as a provider bills it."""
        payload = call.payload
        outcome, duration = endpoint.plan(config, payload)
        if outcome == "hang":
            endpoint.count("hangs")
        elif outcome == "ok":
            duration += config.per_output_token_s * call.output_tokens
        if flex and outcome != "hang":
            duration *= config.flex_slowdown
        if self.stopping.wait(duration * scale):
            return Reply(503, {"error": "shutting_down"})
        if outcome == "error":
            endpoint.count("errors_5xx")
            return Reply(500, {"error": "internal_error", **echo(payload)})
        endpoint.correct(config, call.input_tokens, call.output_estimate, call.output_tokens, scale)
        endpoint.served(payload[config.identity] if config.identity else None, call.input_tokens,
                        call.output_tokens)
        if flex:
            endpoint.count("flex_served")
        if claim is not None:
            claim.account.correct(claim, call.output_tokens, scale)
            claim.account.served(claim, call.output_tokens)
        return Reply(200, call.body)

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = {name: ep.snapshot(self.time_scale) for name, ep in self.endpoints.items()}
        for snapshot in result.values():
            config = snapshot["config"]
            config["scaled_latency_s"] = config["latency_s"] * self.time_scale
            config["time_scale"] = self.time_scale
        result["service"] = {"time_scale": self.time_scale, "auth_required": bool(self._token),
                             "seed": self._seed}
        result["accounts"] = {name: {**account.snapshot(), "endpoints": self._members[name]}
                              for name, account in self.accounts.items()}
        result["batches"] = self.batches.snapshot()
        return result

    def reset(self) -> None:
        for endpoint in self.endpoints.values():
            endpoint.reset()
        self.batches.reset()
        for account in self.accounts.values():
            account.reset()

    def update(self, changes: Mapping[str, Any]) -> None:
        """Apply run-time changes all at once, or none when any is invalid (raises ConfigError)."""
        with self._config_lock:
            changes = dict(changes)
            accounts = self._planned_accounts(changes.pop("accounts", {}))
            batches = changes.pop("batches", {})
            if not isinstance(batches, dict):
                raise ConfigError("batches must be an object of batch settings")
            try:
                batch_config = replace(self.batches.config, **batches)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"batches: {exc}") from None
            time_scale, configs = self._planned(changes)
            for name, config in configs.items():
                self.endpoints[name].reconfigure(config)
            for name, account in accounts.items():
                self.accounts[name].reconfigure(account)
            self.batches.config = batch_config
            if time_scale is not None:
                self._time_scale = time_scale

    def _planned_accounts(self, changes: Any) -> dict[str, AccountConfig]:
        """`accounts: {name: {...}}`: an account's limits (its name, and the endpoints naming it, stay)."""
        if not isinstance(changes, dict):
            raise ConfigError("accounts must be an object of {account: settings}")
        known = {f.name for f in fields(AccountConfig)} - {"name"}
        configs = {}
        for name, settings in changes.items():
            if name not in self.accounts:
                raise ConfigError(f"account must be one of {tuple(self.accounts)}, got {name!r}")
            if not isinstance(settings, dict):
                raise ConfigError(f"accounts.{name} must be an object of account settings")
            unknown = sorted(set(settings) - known)
            if unknown:
                raise ConfigError(f"unknown account settings {unknown}; known: {sorted(known)}")
            configs[name] = replace(self.accounts[name].config, **settings)
        return configs

    def _planned(self, changes: dict[str, Any]) -> tuple[float | None, dict[str, EndpointConfig]]:
        """The changes per endpoint: `{name: {...}}` for one, `endpoint: name` beside settings for
        one, settings alone for every endpoint."""
        time_scale = changes.pop("time_scale", None)
        if time_scale is not None:
            check_time_scale(time_scale)
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
                                  f"known: {sorted(known)}, time_scale, accounts and the endpoints "
                                  f"{list(names)}")
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
        return [requests, tokens, *gauges.values(), scale, *_account_metrics(stats["accounts"])]


# The concurrency figures of an account and of each caller on it: (stats key, family, metric name, help).
FLIGHT = (("in_flight", GaugeMetricFamily, "in_flight", "Calls in flight now"),
          ("max_in_flight", GaugeMetricFamily, "max_in_flight", "Highest concurrency since the last reset"),
          ("busy_s", CounterMetricFamily, "busy_seconds",
           "Calls in flight integrated over wall time since the last reset (per second: mean concurrency)"))


def _account_metrics(accounts: Mapping[str, Any]) -> list[Metric]:
    """The accounts' figures (label account) and their callers' (labels account, caller)."""
    scopes = {"account": ["account"], "caller": ["account", "caller"]}
    flight = {(scope, key): family(f"ai_service_{scope}_{name}", help_text, labels=labels)
              for scope, labels in scopes.items() for key, family, name, help_text in FLIGHT}
    over_quota = CounterMetricFamily("ai_service_account_over_quota", "Calls the account's own meter refused",
                                     labels=["account"])
    limit = GaugeMetricFamily("ai_service_account_limit", "Calls at once across the account's endpoints",
                              labels=["account"])
    counts = {key: CounterMetricFamily(f"ai_service_caller_{key}", help_text, labels=scopes["caller"])
              for key, help_text in (("requests", "Calls that reached the account's meter"),
                                     ("served", "200 answers"))}
    refused = CounterMetricFamily("ai_service_caller_refused", "Calls answered 429, by the kind of limit",
                                  labels=[*scopes["caller"], "kind"])
    tokens = CounterMetricFamily("ai_service_caller_tokens", "Actual tokens of served answers",
                                 labels=[*scopes["caller"], "kind"])
    for account, snapshot in accounts.items():
        over_quota.add_metric([account], snapshot["over_quota"])
        if snapshot["config"]["concurrency"] is not None:
            limit.add_metric([account], snapshot["config"]["concurrency"])
        for key, *_ in FLIGHT:
            flight["account", key].add_metric([account], snapshot[key])
        for caller, figures in snapshot["callers"].items():
            labels = [account, caller]
            for key, *_ in FLIGHT:
                flight["caller", key].add_metric(labels, figures[key])
            for key, family in counts.items():
                family.add_metric(labels, figures[key])
            for kind in REFUSAL_KINDS:
                refused.add_metric([*labels, kind], figures["refused"][kind])
            for kind in ("input", "output"):
                tokens.add_metric([*labels, kind], figures[f"tokens_{kind}"])
    return [over_quota, limit, *flight.values(), *counts.values(), refused, tokens]
