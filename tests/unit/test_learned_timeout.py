"""The learned timeout on latencies written out by hand, then obeyed by the client against a
server that answers after the delay each request asks for."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from consumers.ai.client import AIClient, AIUnavailable, Endpoint, RetryPolicy
from consumers.ai.learned_timeout import LearnedTimeout
from consumers.config.candidate import PipelineConfig
from tests.loopback_http import served
from tests.recorded_tries import Tries


def taught(timeout: LearnedTimeout, latencies: list[float]) -> LearnedTimeout:
    for latency in latencies:
        timeout.ended(timeout.sent(), latency)
    return timeout


HUNDRED = [i / 100 for i in range(1, 101)]  # 0.01 ... 1.00


def test_the_ceiling_holds_until_a_hundred_calls_were_served() -> None:
    timeout = taught(LearnedTimeout(1.0, 10.0), HUNDRED[:99])
    assert timeout.current() == 10.0
    # the 100th: the 99th percentile of 0.01 ... 1.00 (inclusive: rank 0.99 x 99 = 98.01, between
    # 0.99 and 1.00) is 0.9901, times the margin 4 = 3.9604
    timeout.ended(timeout.sent(), HUNDRED[99])
    assert timeout.current() == pytest.approx(3.9604)


def test_the_learned_timeout_keeps_within_its_floor_and_ceiling() -> None:
    assert taught(LearnedTimeout(1.0, 10.0), [0.01] * 100).current() == 1.0  # 4 x 0.01, under the floor
    assert taught(LearnedTimeout(1.0, 10.0), [5.0] * 100).current() == 10.0  # 4 x 5, over the ceiling


def test_a_longer_tail_raises_it_and_a_shorter_one_lowers_it_over_the_last_thousand_calls() -> None:
    timeout = taught(LearnedTimeout(1.0, 60.0), HUNDRED)
    # 1000 calls of 2 s, then 16 more to refresh: the percentile is 2.0 over the last 1000
    taught(timeout, [2.0] * 1000)
    assert timeout.current() == pytest.approx(8.0)
    taught(timeout, [0.5] * 1000)  # the 2 s calls leave the window
    assert timeout.current() == pytest.approx(2.0)


def test_calls_still_out_count_at_their_time_so_far_and_teach_nothing_once_cut() -> None:
    timeout = LearnedTimeout(0.1, 60.0)
    out = [timeout.sent(at=0.0) for _ in range(20)]  # 20 long calls of a burst, still out
    for _ in range(99):
        timeout.ended(timeout.sent(at=4.99), 0.01)
    # the 100th answer at 5.0: 100 served of 0.01 s and 20 out for 5 s; the 99th percentile of
    # those 120 (inclusive: rank 0.99 x 119 = 117.81, among the twenty 5.0s) is 5.0, times 4
    timeout.ended(timeout.sent(at=4.99), 0.01, now=5.0)
    assert timeout.current() == pytest.approx(20.0)
    for ticket in out:  # cut, not served
        timeout.ended(ticket, None)
    for _ in range(16):  # the next refresh: 4 x 0.01 is under the floor
        timeout.ended(timeout.sent(), 0.01)
    assert timeout.current() == 0.1


def test_a_fixed_timeout_learns_nothing() -> None:
    assert taught(LearnedTimeout.fixed(3.0), [0.01] * 200).current() == 3.0


class Delayed(BaseHTTPRequestHandler):
    """Answers 200 after the `delay_s` its request asks for."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(body["delay_s"])
        answer = json.dumps({"ok": True}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def delayed_url() -> Iterator[str]:
    with served(Delayed, "/v1/work") as url:
        yield url


def test_the_client_cuts_a_try_at_the_timeout_in_force_and_teaches_it_its_served_calls(
        delayed_url: str) -> None:
    timeout = taught(LearnedTimeout(0.3, 5.0), [0.02] * 99)
    client = AIClient(Endpoint(delayed_url, timeout_s=5.0), RetryPolicy(max_attempts=1), timeout=timeout)
    try:
        # the 100th served call: 4 x the 99th percentile of 0.02 ... (about 0.1) is under the 0.3 floor
        assert client.call({"delay_s": 0.02}) == {"ok": True}
        assert timeout.current() == 0.3
        tries = Tries()
        began = time.monotonic()
        with pytest.raises(AIUnavailable):
            client.call({"delay_s": 2.0}, tries)
        took = time.monotonic() - began
    finally:
        client.close()
    assert [t.outcome for t in tries.done] == ["timeout"]
    assert 0.3 <= took < 1.5, f"cut after {took:.2f} s, the timeout in force being 0.3 s"


def test_a_config_learns_between_the_declared_latency_and_the_specs_ceiling() -> None:
    config = PipelineConfig(time_scale=0.5)
    # genai_image's generate: a fixed 3 s declared, timeout_s 30: floor 4 x 3 x 0.5 = 6, ceiling 30 x 0.5 = 15
    assert (config.ai_timeout_floor("generate"), config.ai_timeout("generate")) == (6.0, 15.0)
    # check: 0.5 s declared, timeout_s 10: floor max(3, 4 x 0.5 x 0.5) = 3, ceiling max(5, 10 x 0.5) = 5
    assert (config.ai_timeout_floor("check"), config.ai_timeout("check")) == (3.0, 5.0)
    fixed = PipelineConfig(time_scale=0.5, ai_timeout_s=60.0)
    assert (fixed.ai_timeout_floor("generate"), fixed.ai_timeout("generate")) == (60.0, 60.0)
