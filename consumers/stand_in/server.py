"""The stand-in over HTTP: each endpoint's POST at its spec's path, and the service's own routes
(stats, their reset, run-time configuration, health, Prometheus metrics)."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from consumers.stand_in.accounts import ANONYMOUS
from consumers.stand_in.batches import INVALID, error_body
from consumers.stand_in.config import (
    BATCHES,
    CONFIG,
    FILES,
    HEALTH,
    METRICS,
    STATS,
    STATS_RESET,
    ConfigError,
    ServiceConfig,
    route_key,
)
from consumers.stand_in.service import Reply, StandIn

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
MAX_UPLOAD_BYTES = 256 * 1024 * 1024  # a batch file (OpenAI takes 200 MB, Anthropic 256 MB)


class _Handler(BaseHTTPRequestHandler):
    """Routes HTTP requests to the stand-in; keep-alive so clients can pool connections.

    Nagle's algorithm is off: an answer goes out as two writes (headers, then body), and with
    Nagle on, the body waits for the client's delayed ACK of the headers, about 40 ms on Linux,
    on every call (docs/design.md#the-stand-in-answers-without-nagles-algorithm); a real endpoint
    answers without such a stall."""

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
        path = route_key(urlsplit(self.path).path)
        body = self._read_body(MAX_UPLOAD_BYTES if path == FILES else MAX_BODY_BYTES)
        if body is None:
            return
        methods = self.server.routes.get(path)
        if methods is None and path.startswith((f"{BATCHES}/", f"{FILES}/")):
            methods = {"GET": _Handler._batch_get, "POST": _Handler._batch_post}
        if methods is None:
            self._send_json(Reply(404, {"error": "not_found", "path": path}))
        elif method not in methods:
            self._send_json(Reply(405, {"error": "method_not_allowed"}, {"Allow": ", ".join(methods)}))
        else:
            methods[method](self, body)

    def _read_body(self, max_bytes: int) -> bytes | None:
        """The request body, or None after answering a body the service will not read."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            self._send_json(Reply(411, {"error": "length_required"}))
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= max_bytes:
            self.close_connection = True
            self._send_json(Reply(413, {"error": "body_too_large", "max_bytes": max_bytes}))
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
        """An AI request; `X-Caller` names who calls, for the account's counters per caller."""
        caller = (self.headers.get("X-Caller") or "").strip() or ANONYMOUS
        self._send_json(self.standin.call(name, self.headers.get("Authorization"), body, caller))

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

    def _upload(self, body: bytes) -> None:
        if self._admin_allowed():
            self._send_json(Reply(*self.standin.batches.upload(self.headers.get("Content-Type", ""), body)))

    def _create_batch(self, body: bytes) -> None:
        if not self._admin_allowed():
            return
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = None
        if not isinstance(request, dict):
            self._send_json(Reply(400, error_body(INVALID, "a batch is created from a JSON object")))
            return
        self._send_json(Reply(*self.standin.batches.create(request)))

    def _list_batches(self, _body: bytes) -> None:
        """GET /v1/batches?limit=N: the newest batches first."""
        if not self._admin_allowed():
            return
        limit = parse_qs(urlsplit(self.path).query).get("limit", ["20"])[0]
        self._send_json(Reply(*self.standin.batches.listed(int(limit) if limit.isdigit() else 20)))

    def _batch_get(self, _body: bytes) -> None:
        """GET /v1/batches/<id>, or a file's content at /v1/files/<id>/content."""
        if not self._admin_allowed():
            return
        parts = route_key(urlsplit(self.path).path).split("/")  # "", "v1", kind, id[, action]
        if parts[2] == "batches" and len(parts) == 4:
            self._send_json(Reply(*self.standin.batches.retrieve(parts[3])))
        elif parts[2] == "files" and len(parts) == 5 and parts[4] == "content":
            content = self.standin.batches.content(parts[3])
            if content is None:
                self._send_json(Reply(404, error_body(INVALID, "no such file")))
            else:
                self._send(200, content, "application/jsonl")
        else:
            self._send_json(Reply(404, {"error": "not_found"}))

    def _batch_post(self, _body: bytes) -> None:
        """POST /v1/batches/<id>/cancel."""
        if not self._admin_allowed():
            return
        parts = route_key(urlsplit(self.path).path).split("/")
        if parts[2] == "batches" and len(parts) == 5 and parts[4] == "cancel":
            self._send_json(Reply(*self.standin.batches.cancel(parts[3])))
        else:
            self._send_json(Reply(404, {"error": "not_found"}))

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
    STATS: {"GET": _Handler._stats},
    STATS_RESET: {"POST": _Handler._reset},
    CONFIG: {"PUT": _Handler._config},
    HEALTH: {"GET": _Handler._health},
    METRICS: {"GET": _Handler._metrics},
    FILES: {"POST": _Handler._upload},
    BATCHES: {"POST": _Handler._create_batch, "GET": _Handler._list_batches},
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
        by_path.setdefault(route_key(endpoint.config.path), {})[endpoint.config.model] = name
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
