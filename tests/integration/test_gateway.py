"""LiteLLM's proxy in front of the AI stand-in, started as `GATEWAY=litellm` starts it
(infra.ai_gateway): a chat completion through it answers with usage, rate-limit headers and the
cost of its tokens at the configured prices; a failed call is not retried on the caller's behalf;
a model past its requests per minute is refused with 429; the master key reaches no command line,
no log it writes and no answer.

The stand-in and the proxy are this module's own: the test stack's stand-in serves the shipped
specs for the other tests, and a model held to a few requests a minute here would refuse their
calls. The stand-in takes a free port; the proxy, which listens only seconds after it is started
(printed with `pytest -s`), the test stack's gateway port, which `make test` leaves free: a port
picked free beforehand could meanwhile go to a fleet's metrics.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from consumers.stand_in.config import EndpointConfig, ServiceConfig
from consumers.stand_in.server import serve
from host.processes import terminate
from infra import ai_gateway
from infra.ai_gateway import Model
from infra.layout import Layout

# Prices far above real ones, so the cost of a few tokens is a number to check by hand.
MODEL = Model("support-small", rpm=4, tpm=100_000, input_cost_per_token=0.001, output_cost_per_token=0.002)
CHAT = EndpointConfig(path="/v1/chat/completions", protocol="openai_chat", latency_s=0.02,
                      answers=({"when": {}, "body": {"content": "Routed to billing, {user}."}},))
# "Route the ticket." and "My invoice is wrong": 17 + 19 = 36 characters, 9 tokens at 4 each.
MESSAGES = [{"role": "system", "content": "Route the ticket."},
            {"role": "user", "content": "My invoice is wrong"}]
ANSWERS: list[str] = []  # every answer the gateway gave, headers and body (grepped for the key)


@dataclass(frozen=True)
class Gateway:
    url: str
    key: str
    directory: Path
    stand_in: str


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    server = serve(ServiceConfig({"chat": CHAT}), port=0)
    stand_in = f"http://127.0.0.1:{server.server_address[1]}"
    key = ai_gateway.new_key(secrets.token_urlsafe(24))
    port, directory = Layout("test").ai_gateway_port, tmp_path_factory.mktemp("gateway")
    started = time.monotonic()
    pid = ai_gateway.start(directory, port, stand_in, key, [MODEL])
    print(f"LiteLLM's proxy listened {time.monotonic() - started:.1f} s after its start")
    try:
        yield Gateway(f"http://127.0.0.1:{port}", key, directory, stand_in)
    finally:
        terminate(pid, grace_s=10)
        server.shutdown()
        server.server_close()


def set_error_rate(gateway: Gateway, rate: float) -> None:
    requests.put(f"{gateway.stand_in}/v1/config", json={"error_rate": rate}, timeout=5).raise_for_status()


def chat(gateway: Gateway, user: str, key: str | None = None) -> requests.Response:
    response = requests.post(f"{gateway.url}/v1/chat/completions", timeout=30,
                             headers={"Authorization": f"Bearer {key or gateway.key}"},
                             json={"model": MODEL.name, "messages": MESSAGES, "user": user, "max_tokens": 50})
    ANSWERS.append(f"{dict(response.headers)}\n{response.text}")
    return response


def upstream(gateway: Gateway) -> dict[str, int]:
    """What reached the stand-in: answers served, and answered 500."""
    stats = requests.get(f"{gateway.stand_in}/v1/stats", timeout=5).json()["chat"]
    return {"served": stats["served"], "errors_5xx": stats["errors_5xx"]}


def test_a_completion_through_the_gateway_carries_usage_and_its_cost(gateway: Gateway) -> None:
    response = chat(gateway, "u-1")
    assert response.status_code == 200, response.text
    body = response.json()
    # "Routed to billing, u-1." is 23 characters: 6 tokens.
    assert body["choices"][0]["message"]["content"] == "Routed to billing, u-1."
    assert {k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == \
        {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}
    # 9 × 0.001 + 6 × 0.002
    assert float(response.headers["x-litellm-response-cost"]) == pytest.approx(0.021, rel=1e-9)
    assert response.headers["x-ratelimit-limit-requests"] == "4"
    assert response.headers["x-ratelimit-limit-tokens"] == "100000"
    assert {"x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens"} <= set(response.headers)
    assert upstream(gateway) == {"served": 1, "errors_5xx": 0}


def test_a_caller_without_the_master_key_is_refused(gateway: Gateway) -> None:
    # Without a database any other key is looked for there: 400 `no_db_connection`, not served.
    wrong = chat(gateway, "u-2", key="sk-not-the-master-key")
    assert (wrong.status_code, wrong.json()["error"]["type"]) == (400, "no_db_connection")
    assert upstream(gateway) == {"served": 1, "errors_5xx": 0}


def test_a_failed_call_is_not_tried_again_by_the_gateway(gateway: Gateway) -> None:
    set_error_rate(gateway, 1.0)
    try:
        assert chat(gateway, "u-3").status_code == 500
    finally:
        set_error_rate(gateway, 0.0)
    assert upstream(gateway) == {"served": 1, "errors_5xx": 1}


def test_past_its_requests_per_minute_the_model_is_refused_with_429(gateway: Gateway) -> None:
    # rpm 4 counts per clock minute: calls within two of them, 2 × 4 + 1, cannot all pass.
    answers = [chat(gateway, f"u-{4 + i}") for i in range(2 * MODEL.rpm + 1)]
    statuses = [a.status_code for a in answers]
    assert set(statuses) == {200, 429}, statuses
    refused = answers[statuses.index(429)]
    assert refused.json()["error"]["type"] == "throttling_error"
    assert "Model rate limit exceeded. RPM limit=4" in refused.json()["error"]["message"]
    assert "Retry-After" not in refused.headers
    # A refusal never reached the stand-in.
    assert upstream(gateway) == {"served": 1 + statuses.count(200), "errors_5xx": 1}


def test_the_master_key_is_in_no_command_line_log_or_answer(gateway: Gateway) -> None:
    command_lines = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True,
                                   check=True).stdout
    assert "--config" in command_lines  # the proxy is among them
    # The log the check reads is the proxy's, with the refusals it logged.
    assert "Model rate limit exceeded" in ai_gateway.log_file(gateway.directory).read_text()
    files = [p for p in gateway.directory.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"config.yaml", "gateway.log"}
    leaks = [str(p) for p in files if gateway.key.encode() in p.read_bytes()]
    leaks += ["command lines"] if gateway.key in command_lines else []
    leaks += [f"answer {i}" for i, text in enumerate(ANSWERS) if gateway.key in text]
    assert len(ANSWERS) == 2 * MODEL.rpm + 4 and leaks == []
