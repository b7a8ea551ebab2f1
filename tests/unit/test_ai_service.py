"""The AI service stand-in, served in-process on an ephemeral port and called over real HTTP."""

from __future__ import annotations

import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests

from consumers.ai import client as ai_client
from consumers.ai.client import AIClient, RetryPolicy, Try
from consumers.ai.limit import AdaptiveLimit
from consumers.config.pipeline_spec import EndpointSpec, load
from consumers.stand_in.cli import config_from_args, parser
from consumers.stand_in.config import ConfigError, EndpointConfig, ServiceConfig
from consumers.stand_in.endpoint import Refusal, SimulatedEndpoint, sample_latency
from consumers.stand_in.server import serve
from tests.hand_clock import HandClock
from tests.recorded_tries import Tries

SCALE = 0.1
REPO = Path(__file__).resolve().parents[2]
SPECS = (load("genai_image"), load("text_moderation"))
CONFIGS = ServiceConfig.from_specs(SPECS).endpoints
NAMES = sorted(CONFIGS)  # every endpoint both shipped specs declare
CHECK = {"request_id": "r-1", "style": "minimal", "description": "a calm logo"}
GENERATE = {"request_id": "r-2", "style": "playful", "description": "a fox on a bike"}

Start = Callable[..., str]


@pytest.fixture
def start() -> Iterator[Start]:
    """Starts services serving both shipped specs, with EndpointConfig changes per endpoint name
    (`check={"latency_s": 0.01}`); all are stopped after the test."""
    servers = []

    def _start(time_scale: float = SCALE, token: str | None = None, seed: int | None = None,
               **changes: dict[str, Any]) -> str:
        config = ServiceConfig.from_specs(SPECS, time_scale=time_scale, token=token, seed=seed)
        endpoints = {name: replace(c, **changes.get(name, {})) for name, c in config.endpoints.items()}
        server = serve(replace(config, endpoints=endpoints), host="127.0.0.1", port=0)
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield _start
    for server in servers:
        server.shutdown()
        server.server_close()


def url(base: str, name: str) -> str:
    return f"{base}{CONFIGS[name].path}"


def valid(name: str, **fields: str) -> dict[str, str]:
    """A request the endpoint accepts: each required field filled in."""
    return {**{field: f"{field}-1" for field in CONFIGS[name].required}, **fields}


def timed_post(url: str, payload: dict, **kwargs: object) -> tuple[requests.Response, float]:
    began = time.monotonic()
    response = requests.post(url, json=payload, timeout=kwargs.pop("timeout", 5), **kwargs)
    return response, time.monotonic() - began


def stats(base: str, **kwargs: object) -> dict:
    response = requests.get(f"{base}/v1/stats", timeout=5, **kwargs)
    response.raise_for_status()
    return response.json()


def test_answers_after_the_scaled_latency(start: Start) -> None:
    base = start()
    response, elapsed = timed_post(f"{base}/v1/generate", GENERATE)
    assert response.status_code == 200
    assert response.json() == {"request_id": "r-2", "result_url": "https://results.example/r-2.png"}
    assert elapsed >= 3.0 * SCALE
    response, elapsed = timed_post(f"{base}/v1/check", CHECK)
    assert response.json() == {"request_id": "r-1", "verdict": "approved"}
    assert elapsed >= 0.5 * SCALE
    assert stats(base)["generate"]["served"] == 1


def test_forbidden_description_is_rejected(start: Start) -> None:
    base = start(check={"latency_s": 0.01})
    response, _ = timed_post(f"{base}/v1/check", {**CHECK, "description": "a Forbidden symbol"})
    assert response.status_code == 200
    assert response.json()["verdict"] == "rejected"
    response, _ = timed_post(f"{base}/v1/check", {**CHECK, "description": "forbiddenly fine"})
    assert response.json()["verdict"] == "approved"


def test_text_moderation_endpoints_answer_as_their_spec_says(start: Start) -> None:
    base = start()
    post = {"message_id": "m-1", "text": "Buy SPAM now"}
    assert timed_post(f"{base}/v1/moderate", post)[0].json() == {"decision": "block"}
    fine = {"message_id": "m-2", "text": "spammers everywhere"}  # \bspam\b wants the whole word
    for _ in range(2):  # the same message twice: one duplicate
        assert timed_post(f"{base}/v1/moderate", fine)[0].json() == {"decision": "allow"}
    assert timed_post(f"{base}/v1/summarize", post)[0].json() == {"summary": "summary of m-1"}
    assert timed_post(f"{base}/v1/classify", post)[0].json() == {"labels": "news,product"}
    moderate = stats(base)["moderate"]  # duplicates are counted on message_id, the first required field
    assert {k: moderate[k] for k in ("served", "distinct_served", "duplicate_served")} == \
        {"served": 3, "distinct_served": 2, "duplicate_served": 1}
    missing = requests.post(f"{base}/v1/moderate", json={"message_id": "m-3"}, timeout=5)
    assert (missing.status_code, missing.json()["detail"]) == (400, "text must be a non-empty string")


def test_lognormal_latency_has_the_spec_median_and_p99() -> None:
    moderate = CONFIGS["moderate"]  # median 0.3 s, p99 1.5 s
    assert (moderate.distribution, moderate.latency_s) == ("lognormal", 0.3)
    # sigma = ln(1.5 / 0.3) / z(0.99) = ln 5 / 2.32635 = 1.60944 / 2.32635
    assert moderate.sigma == pytest.approx(0.691830, abs=1e-6)
    assert moderate.sigma == math.log(1.5 / 0.3) / 2.3263478740408408
    rng = random.Random(5)
    draws = sorted(sample_latency(moderate, rng) for _ in range(20000))
    assert statistics.median(draws) == pytest.approx(0.3, rel=0.03)
    assert draws[int(0.99 * len(draws))] == pytest.approx(1.5, rel=0.08)
    assert CONFIGS["check"].sigma == 0.0 and sample_latency(CONFIGS["check"], rng) == 0.5


def test_sampled_latencies_follow_the_distribution_and_the_seed() -> None:
    uniform = replace(CONFIGS["generate"], latency_s=2.0, distribution="uniform", jitter=0.25)
    draws = [sample_latency(uniform, random.Random(7)) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same draw
    rng = random.Random(1)
    spread = [sample_latency(uniform, rng) for _ in range(2000)]
    assert min(spread) >= 1.5 and max(spread) <= 2.5 and statistics.pstdev(spread) > 0.2


def test_uniform_latency_is_honoured_over_http(start: Start) -> None:
    base = start(generate={"latency_s": 3.0, "distribution": "uniform", "jitter": 0.5}, seed=11)
    for _ in range(3):
        response, elapsed = timed_post(f"{base}/v1/generate", GENERATE)
        assert response.status_code == 200
        assert elapsed >= 3.0 * 0.5 * SCALE


@pytest.mark.parametrize("name", NAMES)
def test_excess_concurrency_gets_429_with_retry_after(start: Start, name: str) -> None:
    base = start(**{name: {"latency_s": 6.0, "distribution": "fixed", "limit": 4, "retry_after_s": 2.0}})
    barrier = threading.Barrier(12)
    responses: list[requests.Response] = []
    lock = threading.Lock()

    def call() -> None:
        barrier.wait()
        response = requests.post(url(base, name), json=valid(name), timeout=10)
        with lock:
            responses.append(response)

    threads = [threading.Thread(target=call) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 4 + [429] * 8
    rejected = [r for r in responses if r.status_code == 429]
    assert all(float(r.headers["Retry-After"]) == pytest.approx(2.0 * SCALE) for r in rejected)
    assert rejected[0].json()["error"]["type"] == "concurrency"
    endpoint = stats(base)[name]
    assert (endpoint["served"], endpoint["rejected_429"]) == (4, 8)
    assert endpoint["max_in_flight"] == 4
    assert endpoint["in_flight"] == 0


def test_sustains_hundreds_of_concurrent_sleeping_requests(start: Start) -> None:
    base = start(check={"latency_s": 3.0, "limit": 300})
    barrier = threading.Barrier(200)
    codes: list[int] = []

    def call() -> None:
        barrier.wait()
        codes.append(requests.post(f"{base}/v1/check", json=CHECK, timeout=10).status_code)

    threads = [threading.Thread(target=call) for _ in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codes == [200] * 200
    assert stats(base)["check"]["max_in_flight"] > 64


@pytest.mark.parametrize("name", NAMES)
def test_error_rate_answers_500_after_the_latency(start: Start, name: str) -> None:
    base = start(**{name: {"latency_s": 1.0, "distribution": "fixed", "error_rate": 1.0}})
    response, elapsed = timed_post(url(base, name), valid(name))
    assert response.status_code == 500
    assert elapsed >= 1.0 * SCALE
    endpoint = stats(base)[name]
    assert (endpoint["errors_5xx"], endpoint["served"]) == (1, 0)


def test_hang_outlasts_the_client_timeout(start: Start) -> None:
    base = start(generate={"hang_rate": 1.0})  # 30 s x 0.1 = 3 s
    with pytest.raises(requests.Timeout):
        requests.post(f"{base}/v1/generate", json=GENERATE, timeout=0.3)
    assert stats(base)["generate"]["hangs"] == 1


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


@pytest.mark.parametrize(("changes", "outcome", "final"), [
    ({"hang_rate": 1.0}, "timeout", False),  # held past the client's timeout: the request's fault
    ({"error_rate": 1.0, "latency_s": 0.01}, "http_5xx", False),
    ({"token": "s3cret"}, "http_4xx", True),  # no Authorization header: final
])
def test_the_client_names_each_failure_as_the_retry_policy_reads_it(
        start: Start, changes: dict[str, Any], outcome: str, final: bool) -> None:
    token = changes.pop("token", None)
    base = start(**({"token": token} if token else {}), generate=changes)
    client = AIClient(ai_client.Endpoint(f"{base}/v1/generate", timeout_s=0.3), RetryPolicy(max_attempts=1))
    observer = Tries()
    with pytest.raises(ai_client.AIUnavailable) as failed:
        client.call(GENERATE, observer)
    assert [t.outcome for t in observer.done] == [outcome] and failed.value.final is final


def test_a_refused_connection_is_a_connection_error_not_a_timeout() -> None:
    # urllib3 2 raises a refused connection as a kind of connect timeout; a timeout is the
    # request's fault (dead-lettered after the tries), a service not there is not: it is waited for.
    client = AIClient(ai_client.Endpoint(f"http://127.0.0.1:{closed_port()}/v1/generate", timeout_s=2),
                      RetryPolicy(max_attempts=1))
    observer = Tries()
    with pytest.raises(ai_client.AIWaiting):
        client.call(GENERATE, observer)
    assert [t.outcome for t in observer.done] == ["connection_error"]


@pytest.mark.parametrize("name", NAMES)
def test_a_hang_is_answered_late_and_served(start: Start, name: str) -> None:
    base = start(**{name: {"hang_rate": 1.0, "hang_s": 1.0, "latency_s": 0.01}})
    response, elapsed = timed_post(url(base, name), valid(name))
    assert response.status_code == 200
    assert elapsed >= 1.0 * SCALE
    endpoint = stats(base)[name]
    assert (endpoint["hangs"], endpoint["served"]) == (1, 1)


def test_a_hang_the_client_gave_up_on_is_served_all_the_same(start: Start) -> None:
    base = start(generate={"hang_rate": 1.0, "hang_s": 5.0})  # 5 s x 0.1 = 0.5 s
    with pytest.raises(requests.Timeout):
        requests.post(f"{base}/v1/generate", json=GENERATE, timeout=0.1)
    deadline = time.monotonic() + 5
    while stats(base)["generate"]["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stats(base)["generate"]["served"] == 1  # billed, though nobody read the answer


@pytest.mark.parametrize("name", NAMES)
def test_bearer_token_is_required_when_configured(start: Start, name: str) -> None:
    base = start(token="s3cret", **{name: {"latency_s": 0.01}})
    payload = valid(name)
    assert requests.post(url(base, name), json=payload, timeout=5).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert requests.post(url(base, name), json=payload, headers=wrong, timeout=5).status_code == 401
    right = {"Authorization": "Bearer s3cret"}
    assert requests.post(url(base, name), json=payload, headers=right, timeout=5).status_code == 200
    assert requests.get(f"{base}/v1/stats", timeout=5).status_code == 401
    endpoint = stats(base, headers=right)[name]
    assert (endpoint["unauthorized"], endpoint["served"]) == (2, 1)
    assert requests.get(f"{base}/healthz", timeout=5).status_code == 200


def test_stats_reset_zeroes_counters_and_peak(start: Start) -> None:
    base = start(check={"latency_s": 0.01, "limit": 1})
    timed_post(f"{base}/v1/check", CHECK)
    timed_post(f"{base}/v1/check", {"description": "no id"})
    before = stats(base)["check"]
    assert (before["served"], before["bad_requests"], before["max_in_flight"]) == (1, 1, 1)
    requests.post(f"{base}/v1/stats/reset", timeout=5).raise_for_status()
    after = stats(base)
    assert set(after) == {*NAMES, "service", "accounts", "batches"} and after["accounts"] == {}
    for name in NAMES:
        counters = {k: v for k, v in after[name].items() if k not in ("config", "limit_in_force")}
        assert set(counters.values()) == {0}, counters
    assert after["check"]["config"]["limit"] == after["check"]["limit_in_force"] == 1


def test_a_limit_schedule_changes_the_limit_at_its_scaled_times() -> None:
    clock = HandClock()
    schedule = [[10, 1], [20, 2]]  # JSON's lists, as PUT /v1/config brings them
    endpoint = SimulatedEndpoint("check", replace(CONFIGS["check"], limit=2, limit_schedule=schedule), seed=1,
                        clock=clock)
    scale = 0.5  # 10 real-scale seconds pass in 5 wall seconds
    assert [isinstance(endpoint.admit(scale), EndpointConfig) for _ in range(3)] == [True, True, False]
    endpoint.release()
    clock.now = 5.0  # the limit is 1 now, and one call is still in flight
    assert endpoint.admit(scale) == Refusal("rejected_429", CONFIGS["check"].retry_after * scale)
    assert endpoint.snapshot(scale)["limit_in_force"] == 1
    clock.now = 10.0  # back to 2
    assert isinstance(endpoint.admit(scale), EndpointConfig)
    assert endpoint.snapshot(scale)["limit_in_force"] == 2
    clock.now = 11.0
    endpoint.reconfigure(replace(endpoint.config, limit_schedule=[[0, 5]]))  # a new schedule starts now
    assert endpoint.snapshot(scale)["limit_in_force"] == 5


@pytest.mark.parametrize("schedule", [[[10, 1], [5, 2]], [[1, -1]], [[1, 1.5]], [[1]], 7])
def test_a_malformed_limit_schedule_is_refused(schedule: object) -> None:
    with pytest.raises(ConfigError, match="limit_schedule"):
        replace(CONFIGS["check"], limit_schedule=schedule)


@pytest.mark.parametrize("name", NAMES)
def test_put_config_injects_and_clears_an_error_burst(start: Start, name: str) -> None:
    other = next(n for n in NAMES if n != name)
    base = start(**{n: {"latency_s": 0.01} for n in (name, other)})
    config = f"{base}/v1/config"
    requests.put(config, json={"endpoint": name, "error_rate": 1.0}, timeout=5).raise_for_status()
    assert timed_post(url(base, name), valid(name))[0].status_code == 500
    assert timed_post(url(base, other), valid(other))[0].status_code == 200
    requests.put(config, json={"endpoint": name, "error_rate": 0.0}, timeout=5).raise_for_status()
    assert timed_post(url(base, name), valid(name))[0].status_code == 200
    requests.put(config, json={name: {"limit": 0}}, timeout=5).raise_for_status()
    assert timed_post(url(base, name), valid(name))[0].status_code == 429
    requests.put(config, json={"limit": 7}, timeout=5).raise_for_status()  # every endpoint
    assert {stats(base)[n]["config"]["limit"] for n in NAMES} == {7}


def test_fail_when_answers_500_to_the_chosen_requests_and_serves_the_rest(start: Start) -> None:
    base = start(generate={"latency_s": 0.01})
    config = f"{base}/v1/config"
    rule = {"endpoint": "generate", "fail_when": {"request_id": "^(a|b)-", "style": "playful"}}
    requests.put(config, json=rule, timeout=5).raise_for_status()
    sent = {"a-1": "playful", "b-1": "playful", "a-2": "minimal", "c-1": "playful"}
    codes = {rid: timed_post(f"{base}/v1/generate", {**GENERATE, "request_id": rid, "style": style})[0]
             .status_code for rid, style in sent.items()}
    # Both patterns must match: a-2 has another style, c-1 another id.
    assert codes == {"a-1": 500, "b-1": 500, "a-2": 200, "c-1": 200}
    assert timed_post(f"{base}/v1/check", {**CHECK, "request_id": "a-1"})[0].status_code == 200
    current = stats(base)
    assert (current["generate"]["errors_5xx"], current["generate"]["served"]) == (2, 2)
    assert current["generate"]["config"]["fail_when"] == rule["fail_when"]
    assert current["check"]["config"]["fail_when"] == {}

    requests.put(config, json={"endpoint": "generate", "fail_when": {}}, timeout=5).raise_for_status()
    assert timed_post(f"{base}/v1/generate", {**GENERATE, "request_id": "a-1"})[0].status_code == 200
    assert stats(base)["generate"]["duplicate_served"] == 0  # a-1 was never served before


@pytest.mark.parametrize("bad", [{"request_id": "("}, {"request_id": 3}, ["request_id"], "x"])
def test_a_malformed_fail_when_is_refused(start: Start, bad: object) -> None:
    base = start()
    response = requests.put(f"{base}/v1/config", json={"fail_when": bad}, timeout=5)
    assert response.status_code == 400 and "fail_when" in response.json()["detail"]
    assert stats(base)["generate"]["config"]["fail_when"] == {}


def test_duplicate_served_counts_repeats_per_request_id_and_endpoint(start: Start) -> None:
    base = start(check={"latency_s": 0.01}, generate={"latency_s": 0.01})
    for request_id in ("a", "a", "a", "b"):
        assert timed_post(f"{base}/v1/check", {"request_id": request_id})[0].status_code == 200
    assert timed_post(f"{base}/v1/generate", {**GENERATE, "request_id": "a"})[0].status_code == 200
    requests.put(f"{base}/v1/config", json={"endpoint": "check", "error_rate": 1.0},
                 timeout=5).raise_for_status()
    assert timed_post(f"{base}/v1/check", {"request_id": "b"})[0].status_code == 500  # not served
    current = stats(base)
    # check served a x3 and b x1: two ids, two answers beyond the first; generate served a once.
    assert {k: current["check"][k] for k in ("served", "distinct_served", "duplicate_served")} == \
        {"served": 4, "distinct_served": 2, "duplicate_served": 2}
    assert (current["generate"]["distinct_served"], current["generate"]["duplicate_served"]) == (1, 0)
    requests.post(f"{base}/v1/stats/reset", timeout=5).raise_for_status()
    assert (stats(base)["check"]["distinct_served"], stats(base)["check"]["duplicate_served"]) == (0, 0)
    requests.put(f"{base}/v1/config", json={"endpoint": "check", "error_rate": 0.0},
                 timeout=5).raise_for_status()
    timed_post(f"{base}/v1/check", {"request_id": "a"})
    assert stats(base)["check"]["duplicate_served"] == 0  # the reset forgot that a was served



def test_rate_limit_is_a_token_bucket_with_retry_after_until_the_next_token() -> None:
    clock = HandClock()
    endpoint = SimulatedEndpoint("check", replace(CONFIGS["check"], rate_limit_rps=2.0, rate_burst=3), seed=1,
                        clock=clock)
    outcomes = [endpoint.admit(1.0) for _ in range(5)]
    assert [isinstance(o, EndpointConfig) for o in outcomes] == [True, True, True, False, False]
    assert outcomes[3] == Refusal("rate_limited", 0.5)  # one token at 2/s
    clock.now = 0.25  # half a token back
    assert endpoint.admit(1.0) == Refusal("rate_limited", pytest.approx(0.25))
    clock.now = 1.0  # 0.5 + 0.75 s x 2/s = 2 tokens
    assert isinstance(endpoint.admit(1.0), EndpointConfig)
    assert isinstance(endpoint.admit(1.0), EndpointConfig)
    assert endpoint.admit(1.0) == Refusal("rate_limited", pytest.approx(0.5))
    snapshot = endpoint.snapshot(1.0)
    assert (snapshot["rate_limited"], snapshot["rejected_429"], snapshot["in_flight"]) == (4, 0, 5)


def test_rate_limit_follows_the_time_scale() -> None:
    clock = HandClock()
    endpoint = SimulatedEndpoint("check", replace(CONFIGS["check"], rate_limit_rps=2.0), seed=1, clock=clock)
    assert isinstance(endpoint.admit(0.5), EndpointConfig)
    assert endpoint.admit(0.5) == Refusal("rate_limited", 0.25)  # 2/s at 0.5x is 4 per wall second
    clock.now = 0.25
    assert isinstance(endpoint.admit(0.5), EndpointConfig)


def test_a_request_refused_for_concurrency_keeps_its_token() -> None:
    clock = HandClock()
    config = replace(CONFIGS["generate"], latency_s=3.0, limit=1, rate_limit_rps=1.0, rate_burst=2)
    endpoint = SimulatedEndpoint("generate", config, seed=1, clock=clock)
    assert isinstance(endpoint.admit(1.0), EndpointConfig)
    assert endpoint.admit(1.0) == Refusal("rejected_429", 3.0)  # Retry-After defaults to the latency
    endpoint.release()
    assert isinstance(endpoint.admit(1.0), EndpointConfig)  # the second token was kept
    endpoint.release()
    assert endpoint.admit(1.0) == Refusal("rate_limited", 1.0)


@pytest.mark.parametrize("name", NAMES)
def test_rate_limit_switched_on_over_http_answers_429_with_retry_after(start: Start, name: str) -> None:
    base = start(**{name: {"latency_s": 0.01}})
    # 0.01 requests per real-scale second at 0.1x: one token every 10 wall seconds, 2 in the bucket.
    requests.put(f"{base}/v1/config", json={"endpoint": name, "rate_limit_rps": 0.01, "rate_burst": 2},
                 timeout=5).raise_for_status()
    codes = [timed_post(url(base, name), valid(name))[0] for _ in range(3)]
    assert [r.status_code for r in codes] == [200, 200, 429]
    assert codes[2].json()["error"]["type"] == "requests"
    assert 9.0 < float(codes[2].headers["Retry-After"]) <= 10.0
    endpoint = stats(base)[name]
    assert (endpoint["served"], endpoint["rate_limited"], endpoint["rejected_429"]) == (2, 1, 0)
    requests.put(f"{base}/v1/config", json={name: {"rate_limit_rps": None}}, timeout=5).raise_for_status()
    assert timed_post(url(base, name), valid(name))[0].status_code == 200


def test_put_config_changes_latency_and_time_scale(start: Start) -> None:
    base = start(time_scale=0.01)
    config = f"{base}/v1/config"
    response = requests.put(config, json={"time_scale": 0.1, "generate": {"latency_s": 2.0}}, timeout=5)
    assert response.status_code == 200
    assert response.json()["generate"]["config"]["scaled_latency_s"] == pytest.approx(0.2)
    assert timed_post(f"{base}/v1/generate", GENERATE)[1] >= 0.2


def test_put_config_refuses_invalid_changes_as_a_whole(start: Start) -> None:
    base = start()
    config = f"{base}/v1/config"
    for bad in ({"error_rate": 2}, {"latency": 1}, {"endpoint": "draw"}, {"time_scale": 0},
                {"check": {"limit": 3}, "generate": {"distribution": "pareto"}},
                {"moderate": {"limit": 3}, "classify": 5},
                {"rate_limit_rps": 0}, {"rate_limit_rps": "fast"}, {"rate_burst": 0},
                {"rate_burst": 1.5}, {"summarize": {"path": "/v1/other"}},
                {"requests_per_minute": 0}, {"tokens_per_minute": 1.5}, {"tokens": "both"},
                {"retry_after_on_budget": "no"}, {"per_output_token_s": -1}, {"protocol": "openai_chat"},
                {"endpoint": "check", "required": []}):
        assert requests.put(config, json=bad, timeout=5).status_code == 400, bad
    current = stats(base)
    assert current["check"]["config"]["limit"] == 64
    assert current["moderate"]["config"]["limit"] == 64
    assert current["check"]["config"]["error_rate"] == 0.0
    assert current["summarize"]["config"]["path"] == "/v1/summarize"
    assert current["service"]["time_scale"] == SCALE


def test_routing_and_validation(start: Start) -> None:
    base = start()
    assert requests.get(f"{base}/healthz", timeout=5).json() == {"status": "ok"}
    assert requests.get(f"{base}/v1/nothing", timeout=5).status_code == 404
    for name in NAMES:
        assert requests.get(url(base, name), timeout=5).status_code == 405, name
    response = requests.post(f"{base}/v1/generate", json={"request_id": "r"}, timeout=5)
    assert response.status_code == 400
    response = requests.post(f"{base}/v1/check", data=b"not json", timeout=5)
    assert response.status_code == 400
    response = requests.post(f"{base}/v1/check", json={"request_id": "r", "description": 3}, timeout=5)
    assert (response.status_code, response.json()["detail"]) == (400, "description must be a string")
    assert (stats(base)["generate"]["bad_requests"], stats(base)["check"]["bad_requests"]) == (1, 2)


def test_metrics_expose_the_counters(start: Start) -> None:
    base = start(check={"latency_s": 0.01}, classify={"latency_s": 0.01})
    timed_post(f"{base}/v1/check", CHECK)
    timed_post(f"{base}/v1/classify", valid("classify"))
    response = requests.get(f"{base}/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    text = response.text
    assert 'ai_service_requests_total{endpoint="check",outcome="served"} 1.0' in text
    assert 'ai_service_requests_total{endpoint="classify",outcome="served"} 1.0' in text
    for name in ("ai_service_in_flight", "ai_service_max_in_flight", 'ai_service_limit{endpoint="moderate"}',
                 'ai_service_duplicate_served{endpoint="check"} 0.0',
                 'outcome="rejected_429"', 'outcome="rate_limited"', 'outcome="errors_5xx"',
                 'outcome="hangs"', 'outcome="rate_limited_requests"', 'outcome="rate_limited_tokens"',
                 'ai_service_tokens_total{endpoint="check",kind="input"} 6.0',  # 21 characters
                 'ai_service_tokens_total{endpoint="check",kind="output"} 3.0'):  # "r-1approved"
        assert name in text, name


def test_specs_sharing_an_endpoint_must_declare_it_alike() -> None:
    genai = SPECS[0]
    check = genai.endpoints["check"]

    def other(endpoints: dict) -> Any:
        return genai.model_copy(update={"name": "other", "endpoints": endpoints})

    merged = ServiceConfig.from_specs([genai, other({"check": check})])
    assert merged.endpoints == {n: CONFIGS[n] for n in ("check", "generate")}
    with pytest.raises(ConfigError, match="'check' is declared differently by genai_image and other"):
        ServiceConfig.from_specs([genai, other({"check": check.model_copy(update={"concurrency": 8})})])
    with pytest.raises(ConfigError, match=r"genai_image\.check and other\.verify both serve POST /v1/check"):
        ServiceConfig.from_specs([genai, other({"verify": check})])


def test_config_refuses_what_the_service_cannot_serve() -> None:
    check = CONFIGS["check"]
    with pytest.raises(ConfigError, match="reserved"):
        ServiceConfig({"service": check})
    with pytest.raises(ConfigError, match="the service's own"):
        ServiceConfig({"check": replace(check, path="/v1/stats/")})
    with pytest.raises(ConfigError, match="'a' and 'b' both serve"):
        ServiceConfig({"a": check, "b": replace(check, path="/v1/check/")})
    with pytest.raises(ConfigError, match=r"names \['style'\], which are not required"):
        replace(check, answers=({"when": {}, "body": {"url": "{request_id}/{style}"}},))
    with pytest.raises(ConfigError, match="not a regex"):
        replace(check, answers=({"when": {"description": "("}, "body": {}},))


def test_command_line_options_build_the_endpoints() -> None:
    args = parser().parse_args(["--pipelines", "text_moderation", "--limit", "3", "--error-rate", "0.5"])
    config = config_from_args(args)
    assert sorted(config.endpoints) == ["classify", "moderate", "summarize"]
    assert {(c.limit, c.error_rate) for c in config.endpoints.values()} == {(3, 0.5)}
    every = ServiceConfig.from_specs([*SPECS, load("support_tickets")]).endpoints
    assert config_from_args(parser().parse_args([])).endpoints == every


def test_command_line_serves_and_stops_on_sigterm() -> None:
    env = {**os.environ, "AI_SERVICE_TOKEN": "tok"}
    process = subprocess.Popen([sys.executable, "-m", "consumers.stand_in", "--port", "0",
                                "--time-scale", "0.01"], cwd=REPO, env=env,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "serving on 127.0.0.1 port" in line, line
        port = int(line.split(" port ")[1].split()[0])
        base = f"http://127.0.0.1:{port}"
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
        headers = {"Authorization": "Bearer tok"}
        assert requests.post(f"{base}/v1/check", json=CHECK, headers=headers, timeout=5).status_code == 200
        response = requests.post(f"{base}/v1/moderate", json={"message_id": "m", "text": "spam"},
                                 headers=headers, timeout=5)
        assert response.json() == {"decision": "block"}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_client_with_an_adaptive_limit_settles_on_the_service_limit(start: Start) -> None:
    base = start(time_scale=1.0, generate={"latency_s": 0.2, "limit": 2, "retry_after_s": 0.05})
    limiter = AdaptiveLimit(initial=6)  # told nothing: starts above the service's 2
    client = AIClient(ai_client.Endpoint(f"{base}/v1/generate", timeout_s=5), RetryPolicy(max_attempts=20),
                      limiter=limiter)
    payloads = [{**GENERATE, "request_id": f"r-{i}"} for i in range(12)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(client.call, payloads))
    assert [a["request_id"] for a in answers] == [p["request_id"] for p in payloads]
    served = stats(base)["generate"]
    assert served["max_in_flight"] <= 2 and served["served"] == 12
    assert limiter.limit <= 3 and limiter.in_flight == 0  # at most one probe above the service's 2
    assert served["rejected_429"] >= 1  # what it learned the limit from


def test_a_try_the_observer_stops_takes_no_permit(start: Start) -> None:
    base = start(time_scale=1.0, generate={"latency_s": 0.01})
    limiter = AdaptiveLimit(initial=1)

    class Refusing:
        def started(self, attempt: int, at: float) -> None:
            raise RuntimeError("claim lost")

        def ended(self, attempt: object) -> None:
            raise AssertionError("a try that was not sent has no end")

    client = AIClient(ai_client.Endpoint(f"{base}/v1/generate"), limiter=limiter)
    with pytest.raises(RuntimeError, match="claim lost"):
        client.call(GENERATE, Refusing())
    assert (limiter.in_flight, limiter.limit) == (0, 1)
    assert client.call(GENERATE)["request_id"] == GENERATE["request_id"]


def test_a_try_is_recorded_as_sent_once_it_holds_its_permit_and_timed_from_its_send(start: Start) -> None:
    # A try counts as a call from when it is sent, as the provider counts it: a crash while it
    # waits for a permit must leave nothing on record as a call. The second of two calls
    # through one permit waits out the first's 0.3 s, and is recorded and timed from its send.
    base = start(time_scale=1.0, generate={"latency_s": 0.3})
    limiter = AdaptiveLimit.fixed(1)
    seen: list[tuple[int, float, int]] = []  # (attempt, recorded at, permits held while recording)
    ends: list[Try] = []

    class Recording:
        def started(self, attempt: int, at: float) -> None:
            seen.append((attempt, at, limiter.in_flight))

        def ended(self, attempt: Try) -> None:
            ends.append(attempt)

    client = AIClient(ai_client.Endpoint(f"{base}/v1/generate"), limiter=limiter)
    client.call(GENERATE, Recording())
    assert seen[0][2] == 1  # recorded holding its permit: about to be sent
    seen.clear()
    ends.clear()
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda i: client.call({**GENERATE, "request_id": f"r-{i}"}, Recording()), range(2)))
    assert len(seen) == len(ends) == 2 and all(held == 1 for _, _, held in seen)
    first, second = sorted(ends, key=lambda t: t.started)
    recorded = sorted(at for _, at, _ in seen)
    assert recorded[1] >= first.ended - 0.01  # recorded once the first call gave the permit back
    assert 0.3 <= second.ended - second.started < 0.6  # its own call only


# Budgets, as providers meter them: hand-computed on an injected clock, then over HTTP.

def test_a_requests_budget_admits_a_full_bucket_then_one_call_per_refill() -> None:
    clock = HandClock()
    endpoint = SimulatedEndpoint("check", replace(CONFIGS["check"], limit=100, requests_per_minute=60),
                                 seed=1, clock=clock)
    scale = 0.5  # 60 per minute is 1 per real-scale second: 2 per wall second at 0.5x
    assert all(isinstance(endpoint.admit(scale), EndpointConfig) for _ in range(60))
    refused = endpoint.admit(scale)
    assert refused == Refusal("rate_limited_requests", 0.5)
    assert isinstance(refused, Refusal) and refused.kind == "requests"
    assert refused.headers == {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0",
                               "x-ratelimit-reset-requests": "30s"}  # 60 at 2 per second
    clock.now = 0.5
    assert isinstance(endpoint.admit(scale), EndpointConfig)
    assert endpoint.admit(scale) == Refusal("rate_limited_requests", 0.5)
    clock.now = 0.75  # half a request back
    assert endpoint.admit(scale) == Refusal("rate_limited_requests", 0.25)
    snapshot = endpoint.snapshot(scale)
    assert (snapshot["rate_limited_requests"], snapshot["rejected_429"], snapshot["in_flight"]) == (3, 0, 61)


def test_a_tokens_budget_charges_the_estimate_and_is_corrected_to_the_answer() -> None:
    clock = HandClock()
    config = replace(CONFIGS["check"], tokens_per_minute=600)  # 10 tokens per second at 1x
    endpoint = SimulatedEndpoint("check", config, seed=1, clock=clock)
    assert isinstance(endpoint.admit(1.0, input_tokens=100, output_tokens=400), EndpointConfig)
    assert endpoint.budget_headers(1.0) == {"x-ratelimit-limit-tokens": "600",
                                            "x-ratelimit-remaining-tokens": "100",
                                            "x-ratelimit-reset-tokens": "50s"}  # 500 at 10/s
    refused = endpoint.admit(1.0, input_tokens=100, output_tokens=100)  # 200 needed, 100 there
    assert refused == Refusal("rate_limited_tokens", 10.0)
    assert isinstance(refused, Refusal) and refused.kind == "tokens"
    clock.now = 2.0  # 120 tokens; the answer took 40 output tokens of the 400 estimated
    endpoint.correct(config, input_tokens=100, estimate=400, actual=40, scale=1.0)
    assert endpoint.budget_headers(1.0)["x-ratelimit-remaining-tokens"] == "480"
    assert endpoint.budget_headers(1.0)["x-ratelimit-reset-tokens"] == "12s"
    endpoint.reconfigure(replace(config, tokens="input"))  # a new quota: full, and prompts only
    assert isinstance(endpoint.admit(1.0, input_tokens=100, output_tokens=10_000), EndpointConfig)
    endpoint.correct(config, input_tokens=100, estimate=400, actual=0, scale=1.0)  # the old budget's
    assert endpoint.budget_headers(1.0)["x-ratelimit-remaining-tokens"] == "500"
    too_large = endpoint.admit(1.0, input_tokens=601)
    assert too_large == Refusal("rate_limited_tokens", None)  # waiting never helps: no Retry-After
    assert endpoint.snapshot(1.0)["rate_limited_tokens"] == 2


def test_a_reset_starts_a_measurement_with_the_budgets_and_the_rate_limit_full() -> None:
    clock = HandClock()
    config = replace(CONFIGS["check"], limit=100, requests_per_minute=2, tokens_per_minute=60,
                     rate_limit_rps=1.0, rate_burst=1)
    endpoint = SimulatedEndpoint("check", config, seed=1, clock=clock)
    assert isinstance(endpoint.admit(1.0, 20, 20), EndpointConfig)  # 1 request, 40 tokens, the burst
    assert endpoint.admit(1.0, 20, 20) == Refusal("rate_limited_tokens", 20.0)  # 40 needed, 20 there
    endpoint.reset()  # nothing refilled on the clock: it is the reset that fills them
    assert endpoint.budget_headers(1.0) == {"x-ratelimit-limit-requests": "2",
                                            "x-ratelimit-remaining-requests": "2",
                                            "x-ratelimit-reset-requests": "0s",
                                            "x-ratelimit-limit-tokens": "60",
                                            "x-ratelimit-remaining-tokens": "60",
                                            "x-ratelimit-reset-tokens": "0s"}
    assert isinstance(endpoint.admit(1.0, 20, 20), EndpointConfig)  # the rate limit's burst is back too
    assert endpoint.snapshot(1.0)["rate_limited_tokens"] == 0


def test_a_budget_refusal_carries_no_retry_after_when_configured_so() -> None:
    config = replace(CONFIGS["check"], requests_per_minute=1, retry_after_on_budget=False)
    endpoint = SimulatedEndpoint("check", config, seed=1, clock=HandClock())
    assert isinstance(endpoint.admit(1.0), EndpointConfig)
    assert endpoint.admit(1.0) == Refusal("rate_limited_requests", None)


def test_a_request_refused_for_concurrency_takes_nothing_from_the_budgets() -> None:
    config = replace(CONFIGS["check"], limit=1, requests_per_minute=60, tokens_per_minute=60)
    endpoint = SimulatedEndpoint("check", config, seed=1, clock=HandClock())
    assert isinstance(endpoint.admit(1.0, 5, 5), EndpointConfig)
    refused = endpoint.admit(1.0, 5, 5)
    assert refused == Refusal("rejected_429", 0.5) and isinstance(refused, Refusal)
    assert refused.kind == "concurrency"
    assert refused.headers == {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
                               "x-ratelimit-reset-requests": "1s", "x-ratelimit-limit-tokens": "60",
                               "x-ratelimit-remaining-tokens": "50", "x-ratelimit-reset-tokens": "10s"}


def _reset_s(header: str) -> float:
    """An x-ratelimit-reset-* value in seconds (these tests only see `…ms` and `…s`)."""
    return float(header[:-2]) / 1000 if header.endswith("ms") else float(header[:-1])


def test_budgets_over_http_refuse_by_kind_with_openais_headers(start: Start) -> None:
    base = start(check={"latency_s": 0.01, "requests_per_minute": 2})  # 1 per 3 wall seconds at 0.1x
    answers = [timed_post(f"{base}/v1/check", CHECK)[0] for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 429]
    assert [r.headers["x-ratelimit-remaining-requests"] for r in answers] == ["1", "0", "0"]
    assert {r.headers["x-ratelimit-limit-requests"] for r in answers} == {"2"}
    assert "x-ratelimit-limit-tokens" not in answers[0].headers  # only the declared budgets
    refused = answers[2]
    assert refused.json()["error"]["type"] == "requests"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 2.5 < float(refused.headers["Retry-After"]) <= 3.0  # one request at 1/3 per second
    assert 5.5 < _reset_s(refused.headers["x-ratelimit-reset-requests"]) <= 6.0  # two of them
    requests.put(f"{base}/v1/config", json={"check": {"retry_after_on_budget": False}},
                 timeout=5).raise_for_status()
    quiet = timed_post(f"{base}/v1/check", CHECK)[0]
    assert quiet.status_code == 429 and "Retry-After" not in quiet.headers
    assert quiet.headers["x-ratelimit-remaining-requests"] == "0"
    requests.put(f"{base}/v1/config", json={"check": {"requests_per_minute": None, "tokens_per_minute": 5,
                                                      "retry_after_on_budget": True}},
                 timeout=5).raise_for_status()
    too_large = timed_post(f"{base}/v1/check", CHECK)[0]  # 6 + 3 tokens, more than a minute's 5
    assert too_large.status_code == 429 and "Retry-After" not in too_large.headers
    assert too_large.json()["error"]["type"] == "tokens"
    assert "x-ratelimit-limit-requests" not in too_large.headers
    assert too_large.headers["x-ratelimit-limit-tokens"] == "5"
    endpoint = stats(base)["check"]
    assert {k: endpoint[k] for k in ("served", "rate_limited_requests", "rate_limited_tokens", "rejected_429",
                                     "tokens_input", "tokens_output")} == \
        {"served": 2, "rate_limited_requests": 2, "rate_limited_tokens": 1, "rejected_429": 0,
         "tokens_input": 12, "tokens_output": 6}


CHAT = EndpointConfig(
    path="/v1/chat/completions", protocol="openai_chat", latency_s=0.05, per_output_token_s=0.01,
    requests_per_minute=6, tokens_per_minute=60,  # 0.1 requests and 1 token per wall second at 1x
    answers=({"when": {"content": r"(?i)\brefund\b"}, "body": {"content": "We are sorry, {user}."}},
             {"when": {}, "body": {"content": "Noted."}}))
MESSAGES = [{"role": "system", "content": "Be brief."},  # 9 characters
            {"role": "user", "content": "I want a refund now"}]  # 19: the prompt is 28, 7 tokens


@pytest.fixture
def chat() -> Iterator[str]:
    """A service with one OpenAI-compatible chat endpoint at real time scale."""
    server = serve(ServiceConfig({"chat": CHAT}, time_scale=1.0), host="127.0.0.1", port=0)
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    server.shutdown()
    server.server_close()


def test_a_chat_request_gets_an_openai_answer_with_usage(chat: str) -> None:
    request = {"model": "stand-in-1", "messages": MESSAGES, "user": "u-1", "max_tokens": 20,
               "temperature": 0.2}
    response, elapsed = timed_post(chat, request)
    assert response.status_code == 200
    assert elapsed >= 0.05 + 5 * 0.01  # time to first token, then 5 output tokens
    body = response.json()
    assert body["id"].startswith("chatcmpl-") and abs(body["created"] - time.time()) < 5
    assert {k: body[k] for k in ("object", "model")} == {"object": "chat.completion", "model": "stand-in-1"}
    # "We are sorry, u-1." is 18 characters: 5 tokens
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "We are sorry, u-1."},
                                "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    # Charged 7 + 20 (max_tokens) at admission, corrected to 7 + 5: 48 of 60 left, refilled
    # at 1 per second, so about 12 s until full.
    assert response.headers["x-ratelimit-remaining-tokens"] == "48"
    assert 11.5 < _reset_s(response.headers["x-ratelimit-reset-tokens"]) <= 12.0
    assert response.headers["x-ratelimit-remaining-requests"] == "5"
    short = requests.post(chat, json={**request, "max_tokens": 2}, timeout=5).json()
    assert short["choices"][0]["message"]["content"] == "We are s"  # 2 tokens of 4 characters
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    other = requests.post(chat, json={"model": "m", "user": "u-2",
                                      "messages": [{"role": "user", "content": "hello"}]}, timeout=5).json()
    assert other["choices"][0]["message"]["content"] == "Noted."
    assert other["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    base = chat.removesuffix("/v1/chat/completions")
    endpoint = stats(base)["chat"]
    assert {k: endpoint[k] for k in ("served", "duplicate_served", "tokens_input", "tokens_output")} == \
        {"served": 3, "duplicate_served": 1, "tokens_input": 16, "tokens_output": 9}  # u-1 twice


@pytest.mark.parametrize(("change", "detail"), [
    ({"user": None}, "user must be a non-empty string"),
    ({"messages": []}, "messages must be a non-empty list"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages must include a user message"),
    ({"messages": [{"role": "user"}]}, "string content"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"temperature": 3}, "temperature"),
    ({"model": ""}, "model must be a non-empty string"),
])
def test_a_malformed_chat_request_is_refused(chat: str, change: dict[str, Any], detail: str) -> None:
    request = {"model": "m", "messages": MESSAGES, "user": "u-1", **change}
    response = requests.post(chat, json={k: v for k, v in request.items() if v is not None}, timeout=5)
    assert response.status_code == 400 and detail in response.json()["detail"]


def test_a_spec_declares_budgets_the_chat_protocol_and_time_per_token() -> None:
    spec = EndpointSpec.model_validate({
        "connection": "ai", "path": "/v1/chat/completions", "concurrency": 8,
        "requests_per_minute": 500, "tokens_per_minute": 30000, "tokens": "output",
        "latency": {"distribution": "lognormal", "median_s": 0.4, "p99_s": 2.0, "per_output_token_s": 0.02},
        "stand_in": {"protocol": "openai_chat", "answers": [{"body": {"content": "ok {user}"}}]}})
    config = EndpointConfig.from_spec(spec)
    assert (config.protocol, config.identity, config.requests_per_minute, config.tokens_per_minute,
            config.tokens, config.per_output_token_s, config.retry_after_on_budget) == \
        ("openai_chat", "user", 500, 30000, "output", 0.02, True)
    assert not CONFIGS["check"].budgeted and CONFIGS["check"].protocol == "plain"
    with pytest.raises(ConfigError, match="needs a `content` string"):
        replace(CHAT, answers=({"when": {}, "body": {"text": "hi"}},))
    with pytest.raises(ConfigError, match="not required fields"):
        replace(CHAT, answers=({"when": {}, "body": {"content": "{temperature}"}},))
