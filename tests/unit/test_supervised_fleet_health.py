"""A supervised fleet's health: healthy once its /metrics answers, whether supervisord still calls
its process STARTING (its `startsecs` not yet over) or already RUNNING; restarting, stopping or
dead otherwise."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from host.supervisor import ProcessInfo
from pipeline_ops.fleets.supervisord import health_of


class Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"fleet_up 1\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def serving() -> Iterator[int]:
    """A port whose /metrics answers."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent() -> int:
    """A port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process(state: str) -> ProcessInfo:
    return ProcessInfo("fleet-run-generate", state, 4242, None, 0, "", "")


@pytest.mark.parametrize("state", ["STARTING", "RUNNING"])
def test_a_process_up_is_healthy_once_its_metrics_answer(state: str, serving: int, silent: int) -> None:
    assert health_of(process(state), serving) == "healthy"
    assert health_of(process(state), silent) == "starting"


@pytest.mark.parametrize(("state", "health"), [("BACKOFF", "restarting"), ("EXITED", "restarting"),
                                               ("STOPPING", "stopping"), ("FATAL", "dead"),
                                               ("STOPPED", "dead")])
def test_a_process_not_up_is_not_healthy_whatever_its_port_answers(state: str, health: str,
                                                                   serving: int) -> None:
    assert health_of(process(state), serving) == health


def test_no_process_is_dead(serving: int) -> None:
    assert health_of(None, serving) == "dead"
