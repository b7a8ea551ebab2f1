"""A request as its endpoint's protocol reads it (plain JSON, or OpenAI's chat completions) and
the answer it gets, with the tokens both take."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from consumers.ai.rate_budget import tokens_of
from consumers.stand_in.config import EndpointConfig, matches


class BadRequest(ValueError):
    """A request body the endpoint cannot answer (400)."""


def _decode(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise BadRequest("body must be a JSON object")
    return payload


def _check_fields(config: EndpointConfig, payload: Mapping[str, Any]) -> None:
    """The required fields non-empty strings, the ones an answer rule matches strings when present."""
    for name in config.required:
        if not isinstance(payload.get(name), str) or not payload[name]:
            raise BadRequest(f"{name} must be a non-empty string")
    for name in {name for rule in config.answers for name in rule["when"]}:
        if not isinstance(payload.get(name, ""), str):
            raise BadRequest(f"{name} must be a string")


def _max_tokens(payload: Mapping[str, Any]) -> int | None:
    value = payload.get("max_tokens")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise BadRequest("max_tokens must be a positive integer")
    return value


def parse_request(config: EndpointConfig, body: bytes) -> dict[str, Any]:
    """The JSON body, checked for the fields the endpoint's spec insists on."""
    payload = _decode(body)
    _check_fields(config, payload)
    _max_tokens(payload)
    return payload


def parse_chat(body: bytes) -> tuple[dict[str, Any], str]:
    """An OpenAI chat completions request: the fields its answer rules see (`model`, `user` and
    the last user message as `content`, plus `max_tokens` and `service_tier` when given) and its
    whole prompt text."""
    payload = _decode(body)
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    for message in messages:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise BadRequest("each message must have a string role and a string content")
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users:
        raise BadRequest("messages must include a user message")
    for name in ("model", "user"):
        if not isinstance(payload.get(name), str) or not payload[name]:
            raise BadRequest(f"{name} must be a non-empty string")
    temperature = payload.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, int | float)
                                    or not 0 <= temperature <= 2):
        raise BadRequest("temperature must be a number in [0, 2]")
    fields = {"model": payload["model"], "user": payload["user"], "content": users[-1]}
    max_tokens = _max_tokens(payload)
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    if isinstance(payload.get("service_tier"), str):
        fields["service_tier"] = payload["service_tier"]
    return fields, "".join(m["content"] for m in messages)


def echo(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The request id sent back with every answer, as the reference APIs do, when there is one."""
    return {"request_id": payload["request_id"]} if "request_id" in payload else {}


def answer(config: EndpointConfig, payload: dict[str, Any]) -> dict[str, Any]:
    """The body of the first answer rule whose patterns all match the request, formatted with the
    request's fields; a request no rule matches is refused, so a spec's gap shows as bad_requests."""
    for rule in config.answers:
        if matches(rule["when"], payload):
            body = {k: v.format_map(payload) if isinstance(v, str) else v for k, v in rule["body"].items()}
            return {**echo(payload), **body}
    raise BadRequest("no answer rule of the endpoint matches the request")


def _strings(values: Iterable[Any]) -> str:
    return "".join(v for v in values if isinstance(v, str))


@dataclass(frozen=True)
class Call:
    """One valid request and the answer it gets, with the tokens both take: what the budgets
    charge at admission (`max_tokens`, else the answer's) and what they are corrected to."""

    payload: dict[str, Any]  # the fields answer rules, fail_when and the identity read
    body: dict[str, Any]  # the 200 answer
    input_tokens: int
    output_tokens: int  # the answer's actual tokens
    max_tokens: int | None = None

    @property
    def output_estimate(self) -> int:
        return self.output_tokens if self.max_tokens is None else self.max_tokens


def prepare(config: EndpointConfig, body: bytes) -> Call:
    """Parse a request as its endpoint's protocol reads it and make its answer (raises BadRequest).

    A plain request's prompt is its string fields and its answer's tokens the answer body's
    strings; a chat answer is the rule's `content`, cut to `max_tokens` (finish_reason `length`)."""
    if not config.chat:
        payload = parse_request(config, body)
        result = answer(config, payload)
        return Call(payload, result, tokens_of(_strings(payload.values())),
                    tokens_of(_strings(result.values())), payload.get("max_tokens"))
    fields, prompt = parse_chat(body)
    _check_fields(config, fields)
    text = str(answer(config, fields)["content"])
    max_tokens = fields.get("max_tokens")
    completion, finish = tokens_of(text), "stop"
    if max_tokens is not None and completion > max_tokens:
        text, completion, finish = text[:max_tokens * 4], max_tokens, "length"
    prompt_tokens = tokens_of(prompt)
    result = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
              "model": fields["model"],
              "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                           "finish_reason": finish}],
              "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                        "total_tokens": prompt_tokens + completion}}
    return Call(fields, result, prompt_tokens, completion, max_tokens)
