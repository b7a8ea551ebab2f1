"""Durations and deadlines do not follow the wall clock, which jumps (an NTP step, a suspended
VM): the wall clock is read only for the timestamps the runtime stores."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from consumers.ai.client import AIClient, Endpoint, RetryPolicy
from tests.loopback_http import served
from tests.recorded_tries import Tries

REPO = Path(__file__).resolve().parents[2]
JUMP_S = 3600.0


class WallClock:
    """time.time, as far as the test has moved it."""

    def __init__(self) -> None:
        self.real = time.time
        self.offset = 0.0

    def __call__(self) -> float:
        return self.real() + self.offset


@pytest.fixture
def wall(monkeypatch: pytest.MonkeyPatch) -> WallClock:
    clock = WallClock()
    monkeypatch.setattr(time, "time", clock)
    return clock


@pytest.fixture
def answering_url(wall: WallClock) -> Iterator[str]:
    """An endpoint during whose answer the wall clock steps an hour ahead."""

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            wall.offset += JUMP_S
            body = b'{"verdict": "approved"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with served(Answer, "/v1/check") as url:
        yield url


class Latencies:
    """A circuit that admits every try and keeps the latencies it is told."""

    def __init__(self) -> None:
        self.latencies: list[float] = []

    def admit(self, request: str) -> bool:
        return True

    def ended(self, request: str, outcome: str, latency_s: float) -> bool:
        self.latencies.append(latency_s)
        return False

    def serving(self) -> bool:
        return True


def test_a_wall_clock_step_during_a_call_changes_neither_its_latency_nor_its_recorded_span(
        wall: WallClock, answering_url: str) -> None:
    circuit, tries = Latencies(), Tries()
    client = AIClient(Endpoint(answering_url, timeout_s=5.0), RetryPolicy(max_attempts=1),
                      circuit=circuit)  # type: ignore[arg-type]
    try:
        assert client.call({"text": "hello"}, tries, request="r1") == {"verdict": "approved"}
    finally:
        client.close()
    assert wall.offset == JUMP_S  # the step did happen mid-call
    assert len(circuit.latencies) == 1 and 0 <= circuit.latencies[0] < 5
    (done,) = tries.done
    assert 0 <= done.ended - done.started < 5  # the attempt row's span is the call's


# The limiter, built as a fleet builds it, in a process whose wall clock steps an hour back
# while a probe is out: the probe is taken for admitted after 5 % of the median latency and no
# less than 0.1 s (no 429 has measured a round trip yet) as the steady clock says, and the next
# step follows. Run apart, since the step has
# to be in place before the runtime is imported, as an NTP step would be.
LIMITER_UNDER_A_STEP = """
import time
real, offset = time.time, [0.0]
time.time = lambda: real() + offset[0]
from consumers.ai.limit import OK, AdaptiveLimit
limit = AdaptiveLimit(initial=4)
permits = [limit.sent(limit.acquire()) for _ in range(4)]
time.sleep(0.2)
limit.release(permits.pop(), OK)
permits.append(limit.sent(limit.acquire()))
assert (limit.spare(), limit.limit) == (1, 5)
permits.append(limit.sent(limit.acquire()))
offset[0] = -3600.0
time.sleep(0.12)
print(limit.spare(), limit.limit)
"""


def test_the_limiters_probing_goes_on_through_a_wall_clock_step_back() -> None:
    done = subprocess.run([sys.executable, "-c", LIMITER_UNDER_A_STEP], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "6"]
