"""What a try's answer says it used (consumers.ai.client.Usage): the tokens of an OpenAI-compatible
`usage` and the cost a gateway reports, read from hand-written answers; unknown, not 0, where the
answer does not say."""

from __future__ import annotations

from typing import Any

from consumers.ai.client import AIClient, Endpoint, RetryPolicy
from consumers.ai.reply import COST_HEADER, Reply, Usage
from tests.recorded_tries import Tries

# A chat completion as OpenAI-compatible APIs (and LiteLLM's proxy in front of them) answer it.
ANSWER = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1767225600, "model": "small",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "billing"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 57, "completion_tokens": 3, "total_tokens": 60},
}
HEADERS = {COST_HEADER: "2.655e-05", "x-ratelimit-remaining-requests": "119"}


def test_the_tokens_come_from_usage_and_the_cost_from_the_gateways_header() -> None:
    assert Usage.of(ANSWER, HEADERS) == Usage(57, 3, 2.655e-05)
    assert Usage.of(ANSWER, {}) == Usage(57, 3, None)


def test_what_an_answer_does_not_say_is_unknown() -> None:
    assert Usage.of({"label": "ok"}, {}) == Usage()  # a plain answer: no usage
    assert Usage.of([1, 2], {}) == Usage()  # JSON, but not an object
    assert Usage.of({"usage": "57 tokens"}, {}) == Usage()
    garbled = {"usage": {"prompt_tokens": True, "completion_tokens": -3}}
    assert Usage.of(garbled, {COST_HEADER: "free"}) == Usage()
    assert Usage.of({}, {COST_HEADER: "nan"}).reported_cost is None
    assert Usage.of({}, {COST_HEADER: "-0.1"}).reported_cost is None
    assert Usage.of({}, {COST_HEADER: "0"}).reported_cost == 0.0  # a gateway without the model's price


class Answering(AIClient):
    """The real call loop over given replies."""

    def __init__(self, *replies: Reply) -> None:
        super().__init__(Endpoint("http://ai/v1/chat/completions"),
                         RetryPolicy(max_attempts=3, backoff_base_s=0.0, backoff_max_s=0.0))
        self.replies = list(replies)

    def _post(self, payload: dict[str, Any], timeout_s: float) -> Reply:
        return self.replies.pop(0)


def test_each_try_carries_its_answers_usage() -> None:
    client = Answering(Reply(429, {}, "http_429", headers={"x-ratelimit-remaining-requests": "0"}),
                       Reply(200, ANSWER, "ok", headers=HEADERS))
    tries = Tries()
    assert client.call({"model": "small"}, tries, request="r1") == ANSWER
    assert [(t.outcome, t.http_status, t.usage) for t in tries.done] == [
        ("http_429", 429, Usage()), ("ok", 200, Usage(57, 3, 2.655e-05))]
