"""Stand-in for the external generative-AI APIs, served over HTTP for tests and benchmarks.

Consumers call it exactly as they would a real endpoint, so the pipeline's timeouts, retries
and concurrency limits are exercised for real. The reference scenario: a checking AI
(`POST /v1/check`, 0.5 s) and a generative AI (`POST /v1/generate`, 3 s), each serving at most
64 requests at once and answering 429 with `Retry-After` beyond that. A global time-scale
factor shrinks every duration so a test can run the scenario at 0.1x or 0.02x.

Faults are injected per endpoint (`error_rate`: 500 after the latency; `hang_rate`: sleep
`hang_s`, past any sane client timeout, then 504) and can be switched at run time through
`PUT /v1/config`, so a test can start an error burst and clear it. A request-rate limit
(`rate_limit_rps`, a token bucket of `rate_burst` requests, as real APIs meter requests per
minute) answers 429 with the time until the next token as `Retry-After`; switching it on for
a few seconds makes the 429 bursts a shared quota produces. `GET /v1/stats` reports what was
served, including the highest concurrency seen (how tests verify that a consumer fleet never
exceeds the API's limit) and how many request ids were served more than once
(`duplicate_served`: the calls a client paid for twice, counted on the service's side).

    python -m consumers.ai_service --time-scale 0.1 --port 8600
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
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

ENDPOINTS = ("check", "generate")
DISTRIBUTIONS = ("fixed", "uniform", "lognormal")
COUNTERS = ("served", "rejected_429", "rate_limited", "errors_5xx", "hangs", "unauthorized",
            "bad_requests")
MAX_BODY_BYTES = 1024 * 1024
DEFAULT_TOKEN_ENV = "AI_SERVICE_TOKEN"
FORBIDDEN = re.compile(r"\bforbidden\b", re.IGNORECASE)


class ConfigError(ValueError):
    """A configuration the service refuses (answered 400 when it comes over HTTP)."""


def _number(name: str, value: Any, minimum: float = 0.0, maximum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"[{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{name} must be in {bounds}, got {value!r}")


@dataclass(frozen=True)
class EndpointConfig:
    """How one AI endpoint behaves; durations are real-scale seconds (the time scale applies)."""

    latency_s: float = 0.5
    limit: int = 64  # requests served at once; more are answered 429
    distribution: str = "fixed"  # fixed | uniform (latency ± jitter) | lognormal (mean = latency)
    jitter: float = 0.2  # uniform: fraction of the latency either side
    sigma: float = 0.25  # lognormal: shape parameter
    error_rate: float = 0.0  # fraction answered 500 after the latency
    hang_rate: float = 0.0  # fraction that sleep hang_s then answer 504 (checked before errors)
    hang_s: float = 30.0
    retry_after_s: float | None = None  # Retry-After on 429; None means the latency
    rate_limit_rps: float | None = None  # requests per real-scale second; None: no rate limit
    rate_burst: int = 1  # token bucket size: requests admitted back to back at the full rate

    def __post_init__(self) -> None:
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

    @property
    def retry_after(self) -> float:
        return self.latency_s if self.retry_after_s is None else self.retry_after_s


@dataclass(frozen=True)
class ServiceConfig:
    """The whole service: both endpoints, the time scale, optional bearer token and RNG seed."""

    check: EndpointConfig = field(default_factory=lambda: EndpointConfig(latency_s=0.5))
    generate: EndpointConfig = field(default_factory=lambda: EndpointConfig(latency_s=3.0))
    time_scale: float = 1.0
    token: str | None = field(default=None, repr=False)
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_time_scale(self.time_scale)


def _check_time_scale(value: Any) -> None:
    _number("time_scale", value)
    if value <= 0:
        raise ConfigError(f"time_scale must be positive, got {value!r}")


def sample_latency(config: EndpointConfig, rng: random.Random) -> float:
    """One real-scale latency drawn from the endpoint's distribution (lognormal keeps the mean)."""
    if config.distribution == "uniform":
        return max(0.0, config.latency_s * rng.uniform(1 - config.jitter, 1 + config.jitter))
    if config.distribution == "lognormal" and config.latency_s > 0:
        return config.latency_s * rng.lognormvariate(-config.sigma ** 2 / 2, config.sigma)
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

    counter: str  # rejected_429 (concurrency limit) | rate_limited (token bucket empty)
    retry_after_s: float  # wall-clock seconds


class Endpoint:
    """Counters, concurrency slots, rate-limit bucket and RNG of one endpoint, behind one lock.

    `clock` is injectable so the token bucket can be checked against hand-computed times.
    """

    def __init__(self, name: str, config: EndpointConfig, seed: int | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._config = config
        self._lock = threading.Lock()
        self._rng = random.Random(f"{seed}:{name}") if seed is not None else random.Random()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._served: Counter[str] = Counter()  # 200s per request id
        self._in_flight = 0
        self._max_in_flight = 0
        self._clock = clock
        self._tokens = float(config.rate_burst)
        self._refilled_at = clock()

    @property
    def config(self) -> EndpointConfig:
        with self._lock:
            return self._config

    def reconfigure(self, config: EndpointConfig) -> None:
        """A new config; a changed rate limit starts from a full bucket, as a new quota would."""
        with self._lock:
            if (config.rate_limit_rps, config.rate_burst) != (self._config.rate_limit_rps,
                                                              self._config.rate_burst):
                self._tokens, self._refilled_at = float(config.rate_burst), self._clock()
            self._config = config

    def count(self, counter: str) -> None:
        with self._lock:
            self._counts[counter] += 1

    def served(self, request_id: str) -> None:
        """A 200 answer for `request_id`: counted in total and per request id."""
        with self._lock:
            self._counts["served"] += 1
            self._served[request_id] += 1

    def admit(self, scale: float) -> EndpointConfig | Refusal:
        """Pass the rate limit and take a concurrency slot, returning the config in force, or
        count a 429 and say when to retry (atomic). The rate limit is checked first, as an API
        gateway meters requests before they reach the model servers."""
        with self._lock:
            config = self._config
            if config.rate_limit_rps is not None:
                rate = config.rate_limit_rps / scale  # tokens per wall-clock second
                now = self._clock()
                self._tokens = min(config.rate_burst, self._tokens + (now - self._refilled_at) * rate)
                self._refilled_at = now
                if self._tokens < 1:
                    self._counts["rate_limited"] += 1
                    return Refusal("rate_limited", (1 - self._tokens) / rate)
            if self._in_flight >= config.limit:
                self._counts["rejected_429"] += 1
                return Refusal("rejected_429", config.retry_after * scale)
            if config.rate_limit_rps is not None:
                self._tokens -= 1
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            return config

    def release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def plan(self, config: EndpointConfig) -> tuple[str, float]:
        """Draw the outcome (ok | error | hang) and the real-scale latency of one request."""
        with self._lock:
            draw = self._rng.random()
            latency = sample_latency(config, self._rng)
        if draw < config.hang_rate:
            return "hang", config.hang_s
        if draw < config.hang_rate + config.error_rate:
            return "error", latency
        return "ok", latency

    def reset(self) -> None:
        """Zero the counters; the peak restarts from the requests still in flight."""
        with self._lock:
            self._counts = dict.fromkeys(COUNTERS, 0)
            self._served.clear()
            self._max_in_flight = self._in_flight

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            distinct = len(self._served)
            return {**self._counts, "distinct_served": distinct,
                    "duplicate_served": self._counts["served"] - distinct,
                    "in_flight": self._in_flight, "max_in_flight": self._max_in_flight,
                    "config": asdict(self._config)}


class BadRequest(ValueError):
    """A request body the endpoint cannot answer (400)."""


def parse_request(endpoint: str, body: bytes) -> dict[str, Any]:
    """The JSON body, checked for the fields a real API would insist on."""
    try:
        payload = json.loads(body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise BadRequest("body must be a JSON object")
    required = ("request_id", "style", "description") if endpoint == "generate" else ("request_id",)
    for name in required:
        if not isinstance(payload.get(name), str) or not payload[name]:
            raise BadRequest(f"{name} must be a non-empty string")
    if not isinstance(payload.get("description", ""), str):
        raise BadRequest("description must be a string")
    return payload


def answer(endpoint: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The successful answer: a verdict for check, a result URL for generate."""
    request_id = payload["request_id"]
    if endpoint == "check":
        rejected = FORBIDDEN.search(payload.get("description", "")) is not None
        return {"request_id": request_id, "verdict": "rejected" if rejected else "approved"}
    return {"request_id": request_id, "result_url": f"https://results.example/{request_id}.png"}


def _seconds(value: float) -> str:
    """A Retry-After value: seconds, fractional when the time scale makes it so."""
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"


class StandIn:
    """The service's state and behaviour, independent of HTTP so it stays easy to reason about."""

    def __init__(self, config: ServiceConfig) -> None:
        self.endpoints = {name: Endpoint(name, getattr(config, name), config.seed) for name in ENDPOINTS}
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
        try:
            payload = parse_request(name, body)
        except BadRequest as exc:
            endpoint.count("bad_requests")
            return Reply(400, {"error": "bad_request", "detail": str(exc)})
        scale = self.time_scale
        config = endpoint.admit(scale)
        if isinstance(config, Refusal):
            error = "rate_limited" if config.counter == "rate_limited" else "too_many_requests"
            return Reply(429, {"error": error, "retry_after_s": config.retry_after_s},
                         {"Retry-After": _seconds(config.retry_after_s)})
        try:
            return self._serve(endpoint, config, scale, payload)
        finally:
            endpoint.release()

    def _serve(self, endpoint: Endpoint, config: EndpointConfig, scale: float,
               payload: dict[str, Any]) -> Reply:
        outcome, duration = endpoint.plan(config)
        if outcome == "hang":
            endpoint.count("hangs")
        if self.stopping.wait(duration * scale):
            return Reply(503, {"error": "shutting_down"})
        if outcome == "hang":
            return Reply(504, {"error": "upstream_timeout", "request_id": payload["request_id"]})
        if outcome == "error":
            endpoint.count("errors_5xx")
            return Reply(500, {"error": "internal_error", "request_id": payload["request_id"]})
        endpoint.served(payload["request_id"])
        return Reply(200, answer(endpoint.name, payload))

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = {name: ep.snapshot() for name, ep in self.endpoints.items()}
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
        time_scale = changes.pop("time_scale", None)
        if time_scale is not None:
            _check_time_scale(time_scale)
        target = changes.pop("endpoint", None)
        if target is not None and target not in ENDPOINTS:
            raise ConfigError(f"endpoint must be one of {ENDPOINTS}, got {target!r}")
        per_endpoint: dict[str, dict[str, Any]] = {name: {} for name in ENDPOINTS}
        for name in ENDPOINTS:
            nested = changes.pop(name, {})
            if not isinstance(nested, dict):
                raise ConfigError(f"{name} must be an object of endpoint settings")
            per_endpoint[name].update(nested)
        for name in [target] if target else ENDPOINTS:
            per_endpoint[name].update(changes)
        known = {f.name for f in fields(EndpointConfig)}
        configs = {}
        for name, settings in per_endpoint.items():
            unknown = sorted(set(settings) - known)
            if unknown:
                raise ConfigError(f"unknown settings {unknown}; known: {sorted(known)} and time_scale")
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
                                          "200 answers beyond the first per request id since the last reset"),
                                         ("latency_seconds", "Configured latency after the time scale"))}
        stats = self._standin.stats()
        for name in ENDPOINTS:
            snapshot = stats[name]
            for counter in COUNTERS:
                requests.add_metric([name, counter], snapshot[counter])
            gauges["in_flight"].add_metric([name], snapshot["in_flight"])
            gauges["max_in_flight"].add_metric([name], snapshot["max_in_flight"])
            gauges["limit"].add_metric([name], snapshot["config"]["limit"])
            gauges["duplicate_served"].add_metric([name], snapshot["duplicate_served"])
            gauges["latency_seconds"].add_metric([name], snapshot["config"]["scaled_latency_s"])
        scale = GaugeMetricFamily("ai_service_time_scale", "Factor applied to every duration",
                                  value=self._standin.time_scale)
        return [requests, *gauges.values(), scale]


class _Handler(BaseHTTPRequestHandler):
    """Routes HTTP requests to the stand-in; keep-alive so clients can pool connections."""

    server: AIServiceServer
    protocol_version = "HTTP/1.1"
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
        path = urlsplit(self.path).path.rstrip("/") or "/"
        methods = ROUTES.get(path)
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

    def _check(self, body: bytes) -> None:
        self._ai("check", body)

    def _generate(self, body: bytes) -> None:
        self._ai("generate", body)

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
ROUTES: dict[str, dict[str, Route]] = {
    "/v1/check": {"POST": _Handler._check},
    "/v1/generate": {"POST": _Handler._generate},
    "/v1/stats": {"GET": _Handler._stats},
    "/v1/stats/reset": {"POST": _Handler._reset},
    "/v1/config": {"PUT": _Handler._config},
    "/healthz": {"GET": _Handler._health},
    "/metrics": {"GET": _Handler._metrics},
}


class AIServiceServer(ThreadingHTTPServer):
    """Thread per connection; a deep accept backlog so bursts of hundreds of callers queue, not fail."""

    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], standin: StandIn) -> None:
        self.standin = standin
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
    p.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    p.add_argument("--port", type=int, default=8600, help="port to bind (0 picks a free one)")
    p.add_argument("--time-scale", type=float, default=1.0, help="factor applied to every duration")
    p.add_argument("--check-latency", type=float, default=0.5, help="check latency, real-scale seconds")
    p.add_argument("--generate-latency", type=float, default=3.0,
                   help="generate latency, real-scale seconds")
    p.add_argument("--limit", type=int, default=64, help="concurrency limit of each endpoint")
    p.add_argument("--check-limit", type=int, help="concurrency limit of check (overrides --limit)")
    p.add_argument("--generate-limit", type=int, help="concurrency limit of generate (overrides --limit)")
    p.add_argument("--distribution", choices=DISTRIBUTIONS, default="fixed", help="latency distribution")
    p.add_argument("--jitter", type=float, default=0.2, help="uniform: fraction either side of the latency")
    p.add_argument("--sigma", type=float, default=0.25, help="lognormal: shape (the mean stays the latency)")
    p.add_argument("--error-rate", type=float, default=0.0, help="fraction answered 500 (both endpoints)")
    p.add_argument("--hang-rate", type=float, default=0.0, help="fraction that hang then get 504")
    p.add_argument("--hang-s", type=float, default=30.0, help="how long a hang lasts, real-scale seconds")
    p.add_argument("--token-env", default=DEFAULT_TOKEN_ENV,
                   help="environment variable holding the bearer token; unset or empty disables auth")
    p.add_argument("--seed", type=int, help="seed for latencies and injected faults (reproducible runs)")
    p.add_argument("--log-level", default="INFO", help="DEBUG logs every request")
    return p


def config_from_args(args: argparse.Namespace) -> ServiceConfig:
    """The service configuration the command line asks for."""
    def endpoint(latency: float, limit: int | None) -> EndpointConfig:
        return EndpointConfig(latency_s=latency, limit=args.limit if limit is None else limit,
                              distribution=args.distribution, jitter=args.jitter, sigma=args.sigma,
                              error_rate=args.error_rate, hang_rate=args.hang_rate, hang_s=args.hang_s)

    return ServiceConfig(check=endpoint(args.check_latency, args.check_limit),
                         generate=endpoint(args.generate_latency, args.generate_limit),
                         time_scale=args.time_scale, token=os.environ.get(args.token_env) or None,
                         seed=args.seed)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT, then stop accepting and exit 0."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        parser.error(str(exc))
    server = serve(config, args.host, args.port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    host, port = server.server_address[:2]
    log.info("serving on %s port %s (time scale %s, auth %s)", host, port, config.time_scale,
             "on" if config.token else "off")
    while not stop.wait(0.5):
        pass
    log.info("stopping")
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
