"""HTTP work that says what a real API needs: bodies rendered from the event at any depth, an
OpenAI-compatible chat call in a few lines, answer fields kept by path, and a spec check that
names what is wrong. Expectations are written out by hand."""

from __future__ import annotations

import random
from typing import Any

import pytest
import requests

from consumers.config import http_work, pipeline_spec
from consumers.stand_in.config import ConfigError, ServiceConfig
from consumers.stand_in.server import serve

EVENT = {"ticket_id": "t-1", "subject": "Refund", "customer": {"name": "Ada", "tier": 3},
         "tags": ["billing", "eu"]}


def test_a_body_template_renders_text_and_keeps_a_lone_expression_s_type() -> None:
    template = {"input": {"text": "Subject: {{ event.subject }} from {{ event.customer.name }}",
                          "tier": "{{ event.customer.tier }}", "tags": "{{ event.tags }}"},
                "options": [{"fixed": 1}, "{{ event.tags[1] }}"], "plain": "no template"}
    assert http_work.render(template, EVENT) == {
        "input": {"text": "Subject: Refund from Ada", "tier": 3, "tags": ["billing", "eu"]},
        "options": [{"fixed": 1}, "eu"], "plain": "no template"}


@pytest.mark.parametrize("template", ["{{ event.missing }}", "text {{ event.customer.missing }}",
                                      "{{ event.tags[5] }}"])
def test_a_field_the_event_lacks_fails_the_render(template: str) -> None:
    with pytest.raises(http_work.RenderError):
        http_work.render({"x": template}, EVENT)


def test_templates_cannot_reach_past_the_event() -> None:
    with pytest.raises(http_work.RenderError):
        http_work.render("{{ event.__class__.__mro__ }}", EVENT)


@pytest.mark.parametrize(("path", "steps"), [
    ("choices[0].message.content", ["choices", 0, "message", "content"]),
    ("usage.completion_tokens", ["usage", "completion_tokens"]),
    ("[1]", [1]), ("data[0][2].x-y", ["data", 0, 2, "x-y"])])
def test_a_path_reads_as_its_steps(path: str, steps: list[Any]) -> None:
    assert http_work.steps(path) == steps


@pytest.mark.parametrize("path", ["", "a..b", ".a", "a.", "a[x]", "[0]a", "a[0"])
def test_a_malformed_path_is_refused(path: str) -> None:
    with pytest.raises(ValueError):
        http_work.steps(path)


def test_pick_finds_a_value_or_says_it_is_missing() -> None:
    answer = {"choices": [{"message": {"content": "billing"}}], "usage": {"prompt_tokens": 12}}
    assert http_work.pick(answer, "choices[0].message.content") == "billing"
    assert http_work.pick(answer, "usage.prompt_tokens") == 12
    for path in ("choices[1].message", "usage.completion_tokens", "choices.message"):
        assert http_work.pick(answer, path) is http_work.MISSING


def spec_with(work: dict[str, Any], endpoint: dict[str, Any] | None = None) -> dict[str, Any]:
    """A one-stage spec around `work`."""
    return {
        "name": "chat", "key": "ticket_id",
        "topics": {"tickets": {"key": "ticket_id"}, "out": {"key": "ticket_id"}},
        "endpoints": {"assistant": {"connection": "llm", "path": "/v1/chat/completions", "concurrency": 8,
                                "latency": {"median_s": 0.5}, **(endpoint or {})}},
        "stages": {"answer": {
            "source": "tickets",
            "schema": {"type": "object", "required": ["ticket_id", "run_id", "produced_at"]},
            "work": {"kind": "http", "endpoint": "assistant", **work},
            "routes": [{"to": "out", "forward": True, "status": "completed"}]}},
        "load": {"generator": "pipelines.support_tickets:request", "measure": "tickets"}}


CHAT = {"protocol": "openai_chat", "model": "small-model", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "system", "content": "Classify."},
                     {"role": "user", "content": "{{ event.subject }}: {{ event.customer.name }}"}]}


def test_an_openai_chat_work_sends_a_chat_completion_and_keeps_text_and_usage() -> None:
    work = pipeline_spec.parse(spec_with(CHAT)).stages["answer"].work
    assert work.payload(EVENT, "ticket_id") == {
        "model": "small-model", "user": "t-1", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "system", "content": "Classify."},
                     {"role": "user", "content": "Refund: Ada"}]}
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "billing"}}],
              "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}
    assert work.result(answer) == ({"content": "billing", "prompt_tokens": 9, "completion_tokens": 2}, [])
    assert work.result({"choices": []}) == (
        {}, ["choices[0].message.content", "usage.prompt_tokens", "usage.completion_tokens"])


def test_a_chat_work_takes_its_endpoint_s_model_when_it_names_none() -> None:
    spec = pipeline_spec.parse(spec_with({**CHAT, "model": None}, {"model": "large-model"}))
    work = spec.stages["answer"].work
    assert work.payload(EVENT, "ticket_id", spec.endpoints["assistant"].model)["model"] == "large-model"


def test_a_json_body_work_keeps_fields_by_the_names_it_gives_them() -> None:
    work = pipeline_spec.parse(spec_with({
        "body": {"input": {"text": "{{ event.subject }}"}, "tier": "{{ event.customer.tier }}"},
        "keep": {"label": "output.labels[0]", "score": "output.score"}})).stages["answer"].work
    assert work.payload(EVENT, "ticket_id") == {"input": {"text": "Refund"}, "tier": 3}
    assert work.result({"output": {"labels": ["refund", "other"], "score": 0.9}}) == (
        {"label": "refund", "score": 0.9}, [])


@pytest.mark.parametrize(("work", "field", "message"), [
    ({**CHAT, "model": None}, "stages.answer.work.model", "names its model"),
    ({**CHAT, "messages": [{"role": "system", "content": "x"}]}, "stages.answer.work.messages",
     "needs a user message"),
    ({**CHAT, "body": {"a": 1}}, "stages.answer.work.body", "builds its own body"),
    ({"request": {"text": "subject"}, "body": {"text": "{{ event.subject }}"}, "keep": ["x"]},
     "stages.answer.work.body", "either body"),
    ({"request": {"text": "subject"}, "keep": ["x"], "max_tokens": 5}, "stages.answer.work.max_tokens",
     "only an openai_chat work"),
    ({"body": {"text": "{{ event.subject "}, "keep": ["x"]}, "stages.answer.work.body", "template"),
    ({"body": {"text": "x"}, "keep": {"x": "choices[0"}}, "stages.answer.work.keep.x", "not a path"),
    ({"request": {"text": "subject"}}, "stages.answer.work.keep", "name the answer fields"),
])
def test_the_spec_check_names_what_an_http_work_gets_wrong(work: dict[str, Any], field: str,
                                                            message: str) -> None:
    with pytest.raises(pipeline_spec.SpecError) as refused:
        pipeline_spec.parse(spec_with(work))
    assert any(path == field and message in text for path, text in refused.value.problems), \
        refused.value.problems


def test_an_endpoint_without_a_stand_in_is_a_real_api_the_stand_in_leaves_alone() -> None:
    spec = pipeline_spec.parse(spec_with(CHAT))
    assert spec.endpoints["assistant"].stand_in is None
    assert "not served by the stand-in (real APIs only): assistant" in spec.summary()
    with pytest.raises(ConfigError, match="no endpoints to serve"):
        ServiceConfig.from_specs([spec])


def chat_endpoint(model: str | None) -> dict[str, Any]:
    return {"model": model, "stand_in": {"protocol": "openai_chat", "answers": [{"body": {"content": "ok"}}]}}


def test_chat_endpoints_share_a_path_with_a_model_each_and_no_other_endpoint_does() -> None:
    document = spec_with(CHAT, chat_endpoint("small-model"))
    document["endpoints"]["large"] = {**document["endpoints"]["assistant"], **chat_endpoint("large-model")}
    served = ServiceConfig.from_specs([pipeline_spec.parse(document)]).endpoints
    assert {name: e.model for name, e in served.items()} == {"assistant": "small-model",
                                                             "large": "large-model"}
    document["endpoints"]["large"]["model"] = None
    with pytest.raises(ConfigError, match="share a path only with a different model"):
        ServiceConfig.from_specs([pipeline_spec.parse(document)])


def test_the_shipped_llm_pipeline_calls_each_model_by_its_endpoint() -> None:
    spec = pipeline_spec.load("support_tickets")
    (_, ticket), = resolve_generator(spec)(random.Random(7), "run", 0, 0.0)
    triage, draft = spec.stages["triage"].work, spec.stages["draft"].work
    assert (triage.protocol, draft.protocol) == ("openai_chat", "openai_chat")
    sent = triage.payload(ticket, spec.key, spec.endpoints[triage.endpoint].model)
    assert (sent["model"], sent["user"], sent["max_tokens"]) == ("small-model", ticket["ticket_id"], 4)
    assert sent["messages"][1]["content"] == f"{ticket['subject']}\n\n{ticket['body']}"
    sent = draft.payload({**ticket, "category": "billing"}, spec.key, spec.endpoints[draft.endpoint].model)
    assert sent["model"] == "large-model"
    assert sent["messages"][1]["content"].startswith(f"Category: billing\nSubject: {ticket['subject']}\n")


def resolve_generator(spec: pipeline_spec.PipelineSpec) -> Any:
    return pipeline_spec.resolve(spec.load.generator)


def test_the_stand_in_routes_a_chat_completion_by_its_model() -> None:
    spec = pipeline_spec.load("support_tickets")
    server = serve(ServiceConfig.from_specs([spec], time_scale=0.01), port=0)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    triage = spec.stages["triage"].work
    ticket = {"ticket_id": "t-1", "subject": "Charged twice", "body": "Please refund me."}
    try:
        sent = triage.payload(ticket, spec.key, spec.endpoints["small_model"].model)
        answered = requests.post(url, json=sent, timeout=10)
        assert (answered.status_code, triage.result(answered.json())) == (200, ({"category": "billing"}, []))
        refused = requests.post(url, json={**sent, "model": "other-model"}, timeout=10)
        assert (refused.status_code, refused.json()["error"]["code"]) == (404, "model_not_found")
        stats = requests.get(url.replace("/chat/completions", "/stats"), timeout=10).json()
        assert (stats["small_model"]["served"], stats["large_model"]["served"]) == (1, 0)
    finally:
        server.shutdown()
