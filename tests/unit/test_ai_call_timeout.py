"""An AI try is bounded as a whole, not per socket read: an answer that drips in, a byte at a
time, ends as a timeout once the endpoint's timeout has passed, well inside the claim lease
that a member renews before each try (else the call would outlive it and be paid twice)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from consumers.ai.client import AIClient, AIUnavailable, Endpoint, RetryPolicy
from tests.loopback_http import served
from tests.recorded_tries import Tries

ANSWER = json.dumps({"image_url": "https://example.test/a.png"}).encode()
DRIP_S = 0.1  # between two bytes: far under the timeout, so no single read times out
TIMEOUT_S = 0.5


class Dripping(BaseHTTPRequestHandler):
    """Answers 200 at once, then its body a byte every DRIP_S (4 s for the whole answer)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        try:
            for byte in ANSWER:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(DRIP_S)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: what it should do

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def dripping_url() -> Iterator[str]:
    with served(Dripping, "/v1/generate") as url:
        yield url


def test_a_dripping_answer_times_out_within_the_endpoints_timeout(dripping_url: str) -> None:
    client = AIClient(Endpoint(dripping_url, timeout_s=TIMEOUT_S), RetryPolicy(max_attempts=1))
    tries = Tries()
    began = time.monotonic()
    try:
        with pytest.raises(AIUnavailable):
            client.call({"prompt": "a cat"}, tries, request="r1")
    finally:
        client.close()
    took = time.monotonic() - began
    # cut off after its answer began: the status is kept, and the try counts as billed (measure.cost)
    assert [(t.outcome, t.http_status) for t in tries.done] == [("timeout", 200)]
    assert took < TIMEOUT_S + 0.5, f"the try took {took:.2f} s against a timeout of {TIMEOUT_S} s"

