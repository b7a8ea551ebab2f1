"""The AI gateway as `python -m infra.stack up` sets it up with GATEWAY=litellm, checked without
services: LiteLLM's config from the stack's stand-in and the model table, the proxy's command line
and environment, and the stack's env. Expected values are written out by hand (the dev stack's
stand-in on 8600, its gateway on 4000; the test stack's +10000)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from consumers.config import pipeline_spec
from infra import ai_gateway, layout
from infra.ai_gateway import Model
from infra.layout import Layout
from infra.stack_env import Credentials, environment, write_env

KEY = "sk-master-key-for-tests"


def test_each_model_goes_to_the_stand_in_with_its_limits_and_prices() -> None:
    assert ai_gateway.config("http://127.0.0.1:8600") == {
        "model_list": [
            {"model_name": "small-model", "litellm_params": {
                "model": "openai/small-model", "api_base": "http://127.0.0.1:8600/v1",
                "api_key": "os.environ/AI_SERVICE_TOKEN", "allowed_openai_params": ["user"],
                "rpm": 600, "tpm": 200000,
                "input_cost_per_token": 0.00000015, "output_cost_per_token": 0.0000006}},
            {"model_name": "large-model", "litellm_params": {
                "model": "openai/large-model", "api_base": "http://127.0.0.1:8600/v1",
                "api_key": "os.environ/AI_SERVICE_TOKEN", "allowed_openai_params": ["user"],
                "rpm": 120, "tpm": 60000,
                "input_cost_per_token": 0.0000025, "output_cost_per_token": 0.00001}},
            {"model_name": "large-model-next", "litellm_params": {
                "model": "openai/large-model-next", "api_base": "http://127.0.0.1:8600/v1",
                "api_key": "os.environ/AI_SERVICE_TOKEN", "allowed_openai_params": ["user"],
                "rpm": 120, "tpm": 60000,
                "input_cost_per_token": 0.00000375, "output_cost_per_token": 0.000015}},
        ],
        "litellm_settings": {"num_retries": 0},
        "router_settings": {"num_retries": 0, "optional_pre_call_checks": ["enforce_model_rate_limits"]},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }


def test_the_gateway_serves_every_model_the_specs_call_through_it_at_their_prices() -> None:
    # support_tickets' three endpoints on the `llm` connection, which the gateway takes over:
    # $0.15/$0.60, $2.50/$10 and $3.75/$15 per million tokens, as its spec declares per 1,000.
    served = {m.name: (m.input_cost_per_token, m.output_cost_per_token) for m in ai_gateway.MODELS}
    spec = pipeline_spec.load("support_tickets")
    called = {e.model: (e.price.input_per_1k / 1000, e.price.output_per_1k / 1000)
              for e in spec.endpoints.values() if e.connection == "llm"}
    assert set(called) == {"small-model", "large-model", "large-model-next"}
    for name, prices in called.items():
        assert served[name] == pytest.approx(prices), name


def test_the_config_file_is_yaml_naming_the_key_without_holding_it(tmp_path: Path) -> None:
    models = [Model("tiny", rpm=3, tpm=90, input_cost_per_token=0.25, output_cost_per_token=1.5)]
    path = ai_gateway.write_config(tmp_path / "gateway", "http://127.0.0.1:18600", models)
    assert path == tmp_path / "gateway" / "config.yaml"
    assert path.read_text() == (
        "model_list:\n"
        "- model_name: tiny\n"
        "  litellm_params:\n"
        "    model: openai/tiny\n"
        "    api_base: http://127.0.0.1:18600/v1\n"
        "    api_key: os.environ/AI_SERVICE_TOKEN\n"
        "    allowed_openai_params:\n"
        "    - user\n"
        "    rpm: 3\n"
        "    tpm: 90\n"
        "    input_cost_per_token: 0.25\n"
        "    output_cost_per_token: 1.5\n"
        "litellm_settings:\n"
        "  num_retries: 0\n"
        "router_settings:\n"
        "  num_retries: 0\n"
        "  optional_pre_call_checks:\n"
        "  - enforce_model_rate_limits\n"
        "general_settings:\n"
        "  master_key: os.environ/LITELLM_MASTER_KEY\n")
    # Prices as small as real ones are read back as the same numbers.
    cheap = [Model("cheap", rpm=1, tpm=1, input_cost_per_token=1.5e-7, output_cost_per_token=6e-7)]
    params = yaml.safe_load(ai_gateway.write_config(tmp_path, "http://h:1", cheap).read_text())[
        "model_list"][0]["litellm_params"]
    assert (params["input_cost_per_token"], params["output_cost_per_token"]) == (0.00000015, 0.0000006)


def test_the_proxy_gets_the_key_in_its_environment_only_and_none_of_the_stacks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The stack's own database must not be taken for the proxy's (it would try to use it).
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres:pw@127.0.0.1:5433/pipeline")
    env = ai_gateway.environment(KEY, None)
    assert env[ai_gateway.KEY_ENV] == KEY
    assert env["AI_SERVICE_TOKEN"] == "no-token"
    assert "DATABASE_URL" not in env
    # Nothing fetched from the internet: the copies LiteLLM ships, no telemetry.
    assert {k: v for k, v in env.items() if k.startswith(("LITELLM_LOCAL_", "LITELLM_TELEMETRY_"))} == {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
        "LITELLM_LOCAL_BLOG_POSTS": "True", "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
        "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True", "LITELLM_TELEMETRY_DISABLED": "True"}
    assert sorted(k for k in env if not k.startswith(("LITELLM_LOCAL_", "LITELLM_TELEMETRY_"))) == [
        "AI_SERVICE_TOKEN", "HOME", "LANG", "LITELLM_LOG", "LITELLM_MASTER_KEY", "LITELLM_MODE", "PATH"]
    assert ai_gateway.environment(KEY, "stand-in-token")["AI_SERVICE_TOKEN"] == "stand-in-token"
    line = ai_gateway.command(Path("/x/config.yaml"), 4000)
    assert line[1:] == ["--config", "/x/config.yaml", "--host", "127.0.0.1", "--port", "4000",
                        "--num_workers", "1"]
    assert line[0].endswith("/litellm-venv/bin/litellm")


def test_a_stack_with_the_gateway_hands_out_its_url_key_and_connection() -> None:
    env = environment(Layout("test"), 3, "plaintext", Credentials("pg-pw", {}, KEY), "local")
    assert env["AI_GATEWAY_URL"] == "http://127.0.0.1:14000"
    assert env["AI_GATEWAY_KEY"] == KEY
    assert json.loads(env["AIRFLOW_CONN_AI_GATEWAY"]) == {
        "conn_type": "http", "host": "127.0.0.1", "port": 14000, "password": KEY}
    assert env["AI_SERVICE_URL"] == "http://127.0.0.1:18600"  # what the gateway is in front of
    assert env["AIRFLOW_CONN_LLM"] == env["AIRFLOW_CONN_AI_GATEWAY"]  # the LLM pipeline's models
    without = environment(Layout("test"), 3, "plaintext", Credentials("pg-pw", {}), "local")
    assert not [k for k in without if "GATEWAY" in k]
    assert without["AIRFLOW_CONN_LLM"] == "http://127.0.0.1:18600/?stand_in=true"  # the stand-in


def test_the_master_key_is_generated_once_kept_and_dropped_with_the_gateway(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = Credentials("pg", {}).completed("plaintext", "litellm")
    assert first.gateway is not None and first.gateway.startswith("sk-") and len(first.gateway) > 30
    assert first.gateway not in repr(first)
    assert first.completed("plaintext", "litellm").gateway == first.gateway
    assert first.completed("plaintext", "none").gateway is None
    assert first.completed("plaintext").gateway is None
    monkeypatch.setattr(layout, "LOCAL", tmp_path)
    stack = Layout("test")
    write_env(stack, environment(stack, 1, "plaintext", first, "local"))
    assert Credentials.saved(stack).gateway == first.gateway


def test_the_gateway_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY", raising=False)
    assert ai_gateway.mode() == "none"
    monkeypatch.setenv("GATEWAY", "litellm")
    assert ai_gateway.mode() == "litellm"
    monkeypatch.setenv("GATEWAY", "envoy")
    with pytest.raises(SystemExit, match="unknown GATEWAY='envoy'"):
        ai_gateway.mode()
