"""Each AI endpoint is called with its own key, from its own Airflow connection, handed to the
fleet in its environment (never on a command line); endpoints without one share the stand-in's."""

from __future__ import annotations

import json

import pytest

from consumers.config import pipeline_spec
from consumers.config.candidate import KEYS_ENV, Endpoints
from pipeline_ops.connections import endpoint_keys


def test_an_endpoint_s_own_key_wins_over_the_shared_token() -> None:
    endpoints = Endpoints({"small": "http://a/v1", "other": "http://b/v1"}, "Bearer shared",
                          {"small": "k-small"})
    assert endpoints.auth_for("small") == "Bearer k-small"
    assert endpoints.auth_for("other") == "Bearer shared"
    assert json.loads(endpoints.environment()[KEYS_ENV]) == {"small": "k-small"}
    assert KEYS_ENV not in Endpoints({"other": "http://b/v1"}).environment()


def test_the_keys_come_from_the_passwords_of_the_endpoints_connections(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_LLM", "http://:sk-test-123@127.0.0.1:4000/")
    assert endpoint_keys(pipeline_spec.load("support_tickets")) == {
        "small_model": "sk-test-123", "large_model": "sk-test-123", "large_model_next": "sk-test-123"}
    monkeypatch.setenv("AIRFLOW_CONN_AI_SERVICE", "http://127.0.0.1:8600/?stand_in=true")
    assert endpoint_keys(pipeline_spec.load("genai_image")) == {}
