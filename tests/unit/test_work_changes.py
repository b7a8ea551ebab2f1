"""A candidate's changes to a stage's AI work (`pipeline_spec.with_work_changes`): another endpoint
the spec declares, the model, the prompt, the token budget, the temperature. What runs and
judges the candidate reads the changed spec: its fleet, requests, timeouts, prices, and the
stand-in serves the endpoint it switches to; a change the spec cannot take is refused naming the
field. support_tickets' draft moves to large_model_next (30 % slower, 50 % dearer, same answers).
Expectations are written out by hand."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from consumers.config import events, pipeline_spec
from consumers.config.candidate import Endpoints, PipelineConfig
from consumers.config.kafka_connection import KafkaAccess
from consumers.config.presets import PresetParams
from consumers.runs.run_figures import prices_of
from consumers.runtime.fleet import Fleet
from consumers.runtime.fleet_settings import MissingEndpoint, settings_for
from consumers.stand_in.config import ServiceConfig
from consumers.stand_in.server import serve
from measure.cost import Prices

NEXT = {"pipeline": "support_tickets",
        "draft": {"mode": "flow", "window": 32, "work": {"endpoint": "large_model_next"}}}
TICKET = {"ticket_id": "t-1", "run_id": "r1", "subject": "App crashes", "body": "It crashes on start.",
          "category": "bug"}
CHAT = "/v1/chat/completions"
NOWHERE_DB = "postgresql://nobody@127.0.0.1:1/none"  # refused, were it tried


def config_with(work: dict[str, Any], pipeline: str = "support_tickets",
                stage: str = "draft") -> PipelineConfig:
    return PipelineConfig.from_dict({"pipeline": pipeline, stage: {"work": work}})


def test_a_work_change_round_trips_through_json_beside_the_stage_s_consumer_settings() -> None:
    config = PipelineConfig.from_dict(NEXT)
    assert config.stage("draft").work == {"endpoint": "large_model_next"}
    assert config.to_dict()["draft"] == {"mode": "flow", "members": 1, "window": 32, "batch_size": 1,
                                         "ai_calls": None, "adaptive": False,
                                         "work": {"endpoint": "large_model_next"}}
    assert PipelineConfig.from_argument(config.to_json()) == config
    # a stage that changes no work keeps the JSON it had before work changes existed
    unchanged = PipelineConfig.from_dict({"pipeline": "support_tickets", "draft": {}})
    assert "work" not in unchanged.to_dict()["draft"]


def test_the_configuration_s_spec_calls_the_changed_endpoint_with_the_changed_prompt() -> None:
    messages = [{"role": "system", "content": "Reply in one sentence."},
                {"role": "user", "content": "{{ event.subject }}: {{ event.body }}"}]
    config = config_with({"endpoint": "large_model_next", "messages": messages, "max_tokens": 60,
                          "temperature": 0})
    spec = config.spec
    work = spec.stages["draft"].work
    assert isinstance(work, pipeline_spec.HttpWork)
    assert work.payload(TICKET, spec.key, spec.endpoints[work.endpoint].model) == {
        "model": "large-model-next", "user": "t-1", "max_tokens": 60, "temperature": 0,
        "messages": [{"role": "system", "content": "Reply in one sentence."},
                     {"role": "user", "content": "App crashes: It crashes on start."}]}
    assert work.kept == {"reply": "choices[0].message.content", "reply_tokens": "usage.completion_tokens"}
    shipped = pipeline_spec.load("support_tickets")
    assert spec.stages["triage"] == shipped.stages["triage"]
    assert shipped.endpoint_of("draft") == shipped.endpoints["large_model"]  # the spec itself is as declared


def test_the_timeout_floor_and_the_prices_are_the_changed_endpoint_s() -> None:
    # large_model_next's p99 5.2 s + 160 tokens x 0.013 s = 7.28 s, x 4 (learned_timeout.MARGIN);
    # large_model's 4 s + 160 x 0.01 s = 5.6 s
    config, shipped = PipelineConfig.from_dict(NEXT), PipelineConfig(pipeline="support_tickets")
    assert config.ai_timeout_floor("draft") == pytest.approx(29.12)
    assert shipped.ai_timeout_floor("draft") == pytest.approx(22.4)
    assert config.ai_timeout_floor("triage") == shipped.ai_timeout_floor("triage")
    assert prices_of(config.spec) == {"triage": Prices(0.00015, 0.0006), "draft": Prices(0.00375, 0.015)}


def test_a_fleet_of_the_configuration_calls_the_changed_endpoint() -> None:
    config = PipelineConfig.from_dict(NEXT)
    topics, kafka = events.Topics("t", config.spec), KafkaAccess.plain("127.0.0.1:1")
    settings = settings_for(config, "draft", "r1", topics, kafka, NOWHERE_DB,
                            Endpoints.on("http://127.0.0.1:1", config.spec, "Bearer token"))
    assert (settings.ai_endpoint, settings.ai_url) == ("large_model_next", f"http://127.0.0.1:1{CHAT}")
    # the settings go to the fleet's own process as plain data
    assert pickle.loads(pickle.dumps(settings)).work_changes == {"draft": {"endpoint": "large_model_next"}}
    # the fleet runs the changed spec: given large_model's URL alone, it names the one it lacks
    only_large = settings_for(config, "draft", "r1", topics, kafka, NOWHERE_DB,
                              Endpoints({"large_model": f"http://127.0.0.1:1{CHAT}"}))
    with pytest.raises(MissingEndpoint, match="'large_model_next' of pipeline support_tickets"):
        Fleet(only_large)


def test_the_next_model_is_declared_slower_and_dearer_and_sizes_nothing_until_called() -> None:
    spec = pipeline_spec.load("support_tickets")
    large, upcoming = spec.endpoints["large_model"], spec.endpoints["large_model_next"]
    assert (upcoming.connection, upcoming.path, upcoming.model, upcoming.concurrency) == (
        "llm", CHAT, "large-model-next", 64)
    assert (upcoming.latency.median_s, upcoming.latency.p99_s, upcoming.latency.per_output_token_s) == \
        pytest.approx((1.3 * 0.8, 1.3 * 4.0, 1.3 * 0.01))
    assert upcoming.price is not None
    assert (upcoming.price.input_per_1k, upcoming.price.output_per_1k) == \
        pytest.approx((1.5 * 0.0025, 1.5 * 0.01))
    assert upcoming.stand_in == large.stand_in
    # the spec's checks take an endpoint no stage calls; it is no demand on the services
    assert spec.called_endpoints == ("small_model", "large_model")
    assert spec.chain_around("large_model_next") == (0.0, 0.0)
    assert PresetParams(pipeline="support_tickets").bottleneck == "large_model"  # not the slower, unused one
    assert PipelineConfig.from_dict(NEXT).spec.called_endpoints == ("small_model", "large_model_next")


def test_the_stand_in_started_for_the_pipeline_serves_the_next_model() -> None:
    served = ServiceConfig.from_specs([pipeline_spec.load("support_tickets")], time_scale=0.001).endpoints
    large, upcoming = served["large_model"], served["large_model_next"]
    assert (upcoming.model, upcoming.path, upcoming.limit, upcoming.answers) == (
        "large-model-next", CHAT, 64, large.answers)
    assert (upcoming.latency_s, upcoming.sigma) == (pytest.approx(1.04), pytest.approx(large.sigma))
    config = PipelineConfig.from_dict(NEXT)
    spec = config.spec
    work = spec.stages["draft"].work
    assert isinstance(work, pipeline_spec.HttpWork)
    server = serve(ServiceConfig.from_specs([spec], time_scale=0.001), port=0)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        sent = work.payload(TICKET, spec.key, "large-model-next")
        answered = requests.post(url + CHAT, json=sent, timeout=10)
        kept, missing = work.result(answered.json())
        assert (answered.status_code, missing) == (200, [])
        assert kept["reply"].startswith("Hello, and thank you for getting in touch.")
        stats = requests.get(f"{url}/v1/stats", timeout=10).json()
        assert (stats["large_model_next"]["served"], stats["large_model"]["served"]) == (1, 0)
    finally:
        server.shutdown()


# (pipeline, stage, change, the field refused, what it says)
REFUSED: dict[str, tuple[str, str, dict[str, Any], str, str]] = {
    "an unknown field": ("support_tickets", "draft", {"prompt": "Be brief."}, "draft.work.prompt",
                         "not a work change "
                         "(changeable: endpoint, model, messages, max_tokens, temperature)"),
    "a stage without AI work": ("text_moderation", "join", {"model": "x"}, "join.work",
                                "the stage calls no AI endpoint: only an AI work can be changed"),
    "an endpoint the spec lacks": ("support_tickets", "draft", {"endpoint": "huge_model"},
                                   "draft.work.endpoint", "endpoint 'huge_model' is not declared "
                                   "(declared: ['large_model', 'large_model_next', 'small_model'])"),
    "another endpoint's model": ("support_tickets", "draft", {"model": "large-model-next"},
                                 "draft.work.model", "model 'large-model-next' is served at this address "
                                 "by endpoint 'large_model_next': the calls would go to it, limited and "
                                 "priced as endpoint 'large_model'; switch the endpoint to "
                                 "'large_model_next' instead"),
    "a chat field on a json work": ("text_moderation", "summarize", {"temperature": 0.2},
                                    "summarize.work.temperature", "only an openai_chat work takes it"),
    "no user message": ("support_tickets", "draft", {"messages": [{"role": "system", "content": "Reply."}]},
                        "draft.work.messages", "an openai_chat work needs a user message"),
    "an unknown role": ("support_tickets", "draft", {"messages": [{"role": "tool", "content": "x"}]},
                        "draft.work.messages.0.role", "Input should be 'system', 'user' or 'assistant'"),
    "no tokens": ("support_tickets", "draft", {"max_tokens": 0}, "draft.work.max_tokens",
                  "Input should be greater than 0"),
    "a temperature past 2": ("support_tickets", "triage", {"temperature": 2.5}, "triage.work.temperature",
                             "Input should be less than or equal to 2"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_change_the_spec_cannot_take_is_refused_naming_the_field(case: str) -> None:
    pipeline, stage, change, field, message = REFUSED[case]
    with pytest.raises(ValueError, match=rf"^work changes of pipeline {pipeline} refused:") as raised:
        config_with(change, pipeline, stage)
    assert isinstance(raised.value, pipeline_spec.SpecError)
    assert dict(raised.value.problems) == {field: message}


def test_an_endpoint_of_another_protocol_or_a_stage_the_spec_lacks_is_refused() -> None:
    image, tickets = pipeline_spec.load("genai_image"), pipeline_spec.load("support_tickets")
    chat = {**image.endpoints, "small_model": tickets.endpoints["small_model"]}
    both = image.model_copy(update={"endpoints": chat})
    with pytest.raises(pipeline_spec.SpecError) as raised:
        pipeline_spec.with_work_changes(both, {"check": {"endpoint": "small_model"},
                                               "resize": {"model": "x"}})
    assert dict(raised.value.problems) == {
        "check.work.endpoint": "endpoint 'small_model' speaks openai_chat, not the work's protocol json",
        "resize": "genai_image has no stage 'resize' (stages: ['intake', 'check', 'generate'])"}


def test_a_changed_call_is_held_to_the_quota_of_its_new_endpoint(spec_copies: Path) -> None:
    # large_model_next spends a quota of 100 tokens a minute: draft's 160-token answers never fit
    quota = spec_copies / "quotas" / "lab.yaml"
    quota.write_text(yaml.safe_dump({"name": "lab", "tokens_per_minute": 100}))
    path = spec_copies / "support_tickets.yaml"
    document = yaml.safe_load(path.read_text())
    document["endpoints"]["large_model_next"]["quota"] = "lab"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 1_000_000_000))  # a rewrite within a tick is seen
    shipped = pipeline_spec.load("support_tickets")
    assert shipped.endpoint_of("draft") == shipped.endpoints["large_model"]
    with pytest.raises(pipeline_spec.SpecError) as raised:
        PipelineConfig.from_dict(NEXT)
    assert dict(raised.value.problems) == {"stages.draft.work.max_tokens": (
        "a call may spend 160 tokens, more than quota 'lab' meters in a minute (100): "
        "it would never be admitted")}
    fitting = config_with({"endpoint": "large_model_next", "max_tokens": 100})
    assert fitting.spec.endpoints["large_model_next"].quota == "lab"
