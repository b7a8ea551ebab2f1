"""LiteLLM's proxy in front of the AI stand-in, started as `GATEWAY=litellm` starts it
(infra.ai_gateway): a chat completion through it answers with usage, rate-limit headers and the
cost of its tokens at the configured prices; a failed call is not retried on the caller's behalf;
a model past its requests per minute is refused with 429; the documentation's real-API spec
(docs/pipelines.md) runs through it, each request called once and each call's reported cost its
tokens at the spec's prices; the master key reaches no command line, no log, no answer and no row
of the run.

The stand-in and the proxy are this module's own: the test stack's stand-in serves the shipped
specs for the other tests, and a model held to a few requests a minute here would refuse their
calls. The stand-in takes a free port; the proxy, which listens only seconds after it is started
(printed with `pytest -s`), the stack's gateway port, which `make test` leaves free: a port
picked free beforehand could meanwhile go to a fleet's metrics.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from consumers.config import pipeline_spec
from consumers.config.candidate import Endpoints, PipelineConfig
from consumers.runs.pipeline_run import running_pipeline
from consumers.stand_in.config import EndpointConfig, ServiceConfig
from consumers.stand_in.server import serve
from host.processes import terminate
from infra import ai_gateway
from infra.ai_gateway import Model
from pipeline_ops.connections import endpoint_keys, endpoint_urls
from tests.integration.pipeline_fixtures import query
from tests.integration.test_readme_pipeline import real_api_spec
from tests.stack import Stack

# Prices far above real ones, so the cost of a few tokens is a number to check by hand.
MODEL = Model("support-small", rpm=4, tpm=100_000, input_cost_per_token=0.001, output_cost_per_token=0.002)
CHAT = EndpointConfig(path="/v1/chat/completions", protocol="openai_chat", model=MODEL.name, latency_s=0.02,
                      answers=({"when": {}, "body": {"content": "Routed to billing, {user}."}},))
# The documentation's real-API spec calls `small-model`: the gateway serves it as the stack's
# does (its table of models), the stand-in as it does for the support tickets pipeline.
DOCUMENTED = next(m for m in ai_gateway.MODELS if m.name == "small-model")
SMALL_MODEL = EndpointConfig.from_spec(pipeline_spec.load("support_tickets").endpoints["small_model"])
STAND_IN_SCALE = 0.1  # the small model's 0.4 s median call takes 40 ms; CHAT's 20 ms take 2
TICKETS = 40
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
def gateway(stack: Stack) -> Iterator[Gateway]:
    config = ServiceConfig({"chat": CHAT, "small_model": SMALL_MODEL}, time_scale=STAND_IN_SCALE)
    server = serve(config, port=0)
    stand_in = f"http://127.0.0.1:{server.server_address[1]}"
    key = ai_gateway.new_key(secrets.token_urlsafe(24))
    # under the stack's gateway folder: the stack's `down` stops it if this run is interrupted
    port, directory = stack.layout.ai_gateway_port, ai_gateway.folder(stack.layout) / "test"
    shutil.rmtree(directory, ignore_errors=True)  # an earlier run's log would answer for this one's
    directory.mkdir(parents=True)
    started = time.monotonic()
    pid = ai_gateway.start(directory, port, stand_in, key, [MODEL, DOCUMENTED])
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


def test_the_documented_real_api_spec_runs_through_the_gateway_at_its_prices(
        stack: Stack, gateway: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    """The spec's `llm` connection names the gateway and holds its key, as a team's would; its
    fleets run in processes of their own, as deployed ones do. Every ticket is answered by one
    call, and the cost the gateway reported for each is its tokens at the spec's prices."""
    (tmp_path / "ticket_answers.yaml").write_text(real_api_spec())
    monkeypatch.setenv("PIPELINES_DIR", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CONN_LLM", gateway.url.replace("://", f"://:{gateway.key}@"))
    spec = pipeline_spec.load("ticket_answers")
    endpoints = Endpoints(endpoint_urls(spec), keys=endpoint_keys(spec))
    assert endpoints.urls == {"assistant": f"{gateway.url}/v1/chat/completions"}
    config = PipelineConfig(pipeline="ticket_answers", partitions=4, time_scale=STAND_IN_SCALE,
                            replication_factor=1)
    with running_pipeline(config, stack.kafka, stack.database_url, endpoints,
                          fleet_processes=True) as pipeline:
        pipeline.send(TICKETS, reject_share=0.0)
        counts = pipeline.wait_terminal(TICKETS, timeout_s=180)
        command_lines = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True,
                                       check=True).stdout
    assert counts == {"completed": TICKETS}
    served = requests.get(f"{gateway.stand_in}/v1/stats", timeout=5).json()["small_model"]
    assert (served["served"], served["duplicate_served"]) == (TICKETS, 0)

    # One call per ticket, answered; the tokens it kept from the gateway's answer are the row's.
    calls = query(stack.database_url, "SELECT a.outcome, a.http_status, a.tokens_input, a.tokens_output, "
                  "a.reported_cost, (r.result->>'tokens')::int FROM ai_attempts a JOIN stage_results r "
                  "USING (pipeline, run_id, request_id, stage) WHERE a.run_id = %s", pipeline.run_id)
    assert len(calls) == TICKETS
    price = spec.endpoints["assistant"].price
    declared = []
    for outcome, status, tokens_in, tokens_out, reported, kept in calls:
        assert (outcome, status, kept) == ("ok", 200, tokens_in + tokens_out)
        declared.append(tokens_in / 1000 * price.input_per_1k + tokens_out / 1000 * price.output_per_1k)
        assert reported == pytest.approx(declared[-1], rel=0.01)
    assert sum(reported for *_, reported, _ in calls) == pytest.approx(sum(declared), rel=0.01)
    assert sum(declared) > 0

    # The key: in no command line while the fleets ran (the proxy's and theirs among them), in
    # nothing they printed, in no row the run wrote.
    assert "--config" in command_lines and "spawn_main" in command_lines
    rows = query(stack.database_url, " UNION ALL ".join(
        f"SELECT t::text FROM {table} t WHERE run_id = %s"
        for table in ("runs", "requests", "stage_results", "ai_attempts")), *[pipeline.run_id] * 4)
    printed = capfd.readouterr()
    places = [("command lines", command_lines), ("fleet output", printed.out + printed.err),
              *((f"row {i}", row) for i, (row,) in enumerate(rows))]
    leaks = [name for name, text in places if gateway.key in text]
    assert len(rows) == 1 + 3 * TICKETS and leaks == []


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
