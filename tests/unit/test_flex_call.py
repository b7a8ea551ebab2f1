"""A call's flex try (consumers.ai.client.Flex): asked at the flex tier with the tier's request
fields, given until the record's fallback time, then realtime at once when it gave no answer;
its failures are not the request's own. Replies written out by hand."""

from __future__ import annotations

import json
import time
from typing import Any

from consumers.ai.client import AIClient, Endpoint, Flex, RetryPolicy
from consumers.ai.reply import FLEX_SHORT, Reply, refusal_kind
from tests.recorded_tries import Tries

ANSWER = {"choices": [{"message": {"content": "draft"}}]}
FIELDS = {"service_tier": "flex"}
# OpenAI's answer to a flex call it has no capacity for, as the stand-in gives it
FLEX_REFUSAL = json.dumps({"error": {"type": "resource_unavailable", "code": "resource_unavailable",
                                     "message": "flex capacity is short"}}).encode()


class Answering(AIClient):
    """The real call loop over given replies; keeps what each try sent and was given."""

    def __init__(self, *replies: Reply, max_attempts: int = 3) -> None:
        super().__init__(Endpoint("http://ai/v1/chat/completions", timeout_s=30.0),
                         RetryPolicy(max_attempts=max_attempts, backoff_base_s=0.0, backoff_max_s=0.0))
        self.replies = list(replies)
        self.sent: list[tuple[dict[str, Any], float]] = []

    def _post(self, payload: dict[str, Any], timeout_s: float) -> Reply:
        self.sent.append((payload, timeout_s))
        return self.replies.pop(0)


def test_a_flex_answer_is_one_try_at_the_flex_tier_with_its_fields() -> None:
    client, tries = Answering(Reply(200, ANSWER, "ok")), Tries()
    assert client.call({"model": "m"}, tries, "r1", flex=Flex(FIELDS, time.time() + 20)) == ANSWER
    assert [(t.attempt, t.tier, t.outcome) for t in tries.done] == [(1, "flex", "ok")]
    payload, timeout_s = client.sent[0]
    assert payload == {"model": "m", "service_tier": "flex"}
    assert 19.0 < timeout_s <= 20.0  # until the fallback time, under the endpoint's 30 s


def test_a_refused_flex_try_is_followed_by_a_realtime_one_at_once() -> None:
    refused = Reply(429, {}, "http_429", refusal=refusal_kind(FLEX_REFUSAL, {}))
    client, tries = Answering(refused, Reply(200, ANSWER, "ok")), Tries()
    assert client.call({"model": "m"}, tries, "r1", flex=Flex(FIELDS, time.time() + 20)) == ANSWER
    assert [(t.attempt, t.tier, t.outcome, t.own) for t in tries.done] == [
        (1, "flex", "http_429", False), (2, "realtime", "ok", False)]
    assert client.sent[1][0] == {"model": "m"}  # realtime: without the flex fields
    assert client.sent[1][1] == client.timeout.current()


def test_a_flex_try_that_timed_out_is_not_the_requests_failure() -> None:
    # one own failure left: had the flex timeout counted, no realtime try would follow
    client, tries = Answering(Reply(None, {}, "timeout"), Reply(200, ANSWER, "ok")), Tries()
    assert client.call({"model": "m"}, tries, "r1", budget=1, flex=Flex(FIELDS, time.time() + 5)) == ANSWER
    assert [(t.tier, t.outcome) for t in tries.done] == [("flex", "timeout"), ("realtime", "ok")]


def test_past_its_fallback_time_a_record_is_called_realtime_only() -> None:
    client, tries = Answering(Reply(200, ANSWER, "ok")), Tries()
    assert client.call({"model": "m"}, tries, "r1", flex=Flex(FIELDS, time.time() - 1)) == ANSWER
    assert [(t.attempt, t.tier) for t in tries.done] == [(1, "realtime")]


def test_a_flex_refusal_is_read_as_such_not_as_a_full_service() -> None:
    assert refusal_kind(FLEX_REFUSAL, {}) == FLEX_SHORT == "resource_unavailable"
    coded = json.dumps({"error": {"code": "resource_unavailable", "message": "try later"}}).encode()
    assert refusal_kind(coded, {}) == "resource_unavailable"
    assert refusal_kind(b'{"error": {"message": "busy"}}', {}) == "concurrency"


class LateAdmission(Answering):
    """Its tries wait past the flex try's time for their permit."""

    def _admitted(self, *args: Any, **kwargs: Any) -> Any:
        admitted = super()._admitted(*args, **kwargs)
        time.sleep(0.05)
        return admitted


def test_a_flex_try_whose_time_ran_out_waiting_for_its_permit_is_not_sent() -> None:
    client, tries = LateAdmission(Reply(200, ANSWER, "ok")), Tries()
    assert client.call({"model": "m"}, tries, "r1", flex=Flex(FIELDS, time.time() + 0.02)) == ANSWER
    assert [(t.attempt, t.tier, t.outcome) for t in tries.done] == [(1, "realtime", "ok")]
    assert [payload for payload, _ in client.sent] == [{"model": "m"}]  # nothing sent at flex
