"""Every AI try's tokens on record: real calls to the stand-in's OpenAI chat protocol, each try's
attempt row written before it is sent and completed after it as a stage does (the claim's first
row, `stages._AttemptLog`, the result's statement), against the real database; the rows' tokens
add up to what the stand-in itself counted, and the run's cost figures follow from them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from consumers.ai.client import AIClient, AIUnavailable, AIWaiting, Endpoint, RetryPolicy
from consumers.runs.run_figures import ATTEMPTS_SQL, rows
from consumers.runtime import stages
from consumers.runtime.storage import CallClaim, Key, Origin, Storage
from consumers.stand_in.config import EndpointConfig, ServiceConfig
from consumers.stand_in.server import serve
from measure import cost
from tests.integration.pipeline_fixtures import query
from tests.stack import Stack

STAGE = "reply"
REQUESTS = 24
BROKEN = (5, 17)  # requests whose text the stand-in always fails (500): tries, but no tokens
CHAT = EndpointConfig(
    path="/v1/chat/completions", protocol="openai_chat", latency_s=0.03, per_output_token_s=0.001,
    limit=3,  # below the 8 callers: some tries are refused 429, without tokens
    fail_when={"content": "broken"},
    answers=({"when": {"content": "refund"}, "body": {"content": "Your refund is on its way, {user}."}},
             {"when": {}, "body": {"content": "Thank you {user}, a person will answer your ticket soon."}}))
PRICES = cost.Prices(0.5, 1.5)  # per 1,000 input and output tokens


@pytest.fixture
def chat_service() -> Iterator[str]:
    """The stand-in with one chat endpoint, in this process at real time scale."""
    server = serve(ServiceConfig({"chat": CHAT}, seed=7), host="127.0.0.1", port=0)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def message(i: int) -> str:
    """Ticket texts of different lengths, so the answers' and prompts' tokens differ."""
    kind = "broken" if i in BROKEN else "refund" if i % 3 == 0 else "question"
    return f"ticket {i}: {kind} " + "please help " * i


def call(storage: Storage, client: AIClient, key: Key, i: int) -> bool:
    """One request's AI call as a stage makes it: the claim (with the first try's row), the tries
    through the attempt log, then the result with the tries' endings, or their endings alone;
    handled again while the call waits (429s only), as a stage's record is, until it has a
    reply or has had its own tries (False)."""
    origin = Origin(f"{STAGE}-0", "costs.tickets", 0, i)
    state = stages.RecordState()
    ctx = stages.StageContext(stage=STAGE, topics=None, storage=storage, outbox=None)  # type: ignore[arg-type]
    payload = {"model": "small", "user": key.request_id, "max_tokens": 40,
               "messages": [{"role": "system", "content": "Answer support tickets briefly."},
                            {"role": "user", "content": message(i)}]}
    while True:
        _, claim = storage.take(key, time.time(), {}, None, CallClaim(STAGE, state.owner, 30.0, origin))
        assert claim is not None and claim.first_attempt is not None
        log = stages._AttemptLog(ctx, key, origin, state, {1: claim.first_attempt})
        try:
            answer = client.call(payload, log, request=key.request_id,
                                 budget=client.policy.max_attempts - claim.own_failures)
        except (AIUnavailable, AIWaiting) as exc:
            storage.end_attempts(state.unwritten)
            state.unwritten.clear()
            if isinstance(exc, AIUnavailable):
                return False
            continue
        storage.record_result(key, STAGE, {"reply": answer["choices"][0]["message"]["content"]}, origin,
                              None, True, state.unwritten)
        return True


def test_the_attempt_rows_tokens_are_the_stand_ins_own_count(stack: Stack, chat_service: str) -> None:
    run_id = f"costs-{uuid.uuid4().hex[:10]}"
    keys = [Key("costs", f"{run_id}-{i:02d}", run_id) for i in range(REQUESTS)]
    storage = Storage(stack.database_url, pool_size=4)
    client = AIClient(Endpoint(f"{chat_service}/v1/chat/completions", timeout_s=5.0),
                      RetryPolicy(max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.05))
    try:
        with ThreadPoolExecutor(8) as pool:
            done = list(pool.map(lambda n: call(storage, client, keys[n], n), range(REQUESTS)))
    finally:
        client.close()
        storage.close()
    assert [n for n, ok in enumerate(done) if not ok] == list(BROKEN)

    served = requests.get(f"{chat_service}/v1/stats", timeout=5).json()["chat"]
    tries = query(stack.database_url, "SELECT outcome, tokens_input, tokens_output, reported_cost "
                  "FROM ai_attempts WHERE run_id = %s", run_id)
    ok = [t for t in tries if t[0] == "ok"]
    assert len(ok) == served["served"] == REQUESTS - len(BROKEN)
    assert sum(t[1] for t in ok) == served["tokens_input"] > 0
    assert sum(t[2] for t in ok) == served["tokens_output"] > 0
    failed = [t for t in tries if t[0] != "ok"]
    assert {t[0] for t in failed} >= {"http_5xx"}  # the broken tickets' tries (and any 429s)
    assert all(t[1:3] == (None, None) for t in failed)  # no answer, no tokens
    assert all(t[3] is None for t in tries)  # the stand-in is no gateway: no cost reported

    # The figures from the same rows: every billed try is a used ok one here, priced at 0.5 and
    # 1.5 per 1,000 of the tokens the stand-in counted, over the requests that got their reply.
    completed = REQUESTS - len(BROKEN)
    found = rows(stack.database_url, ATTEMPTS_SQL, {"run": run_id})
    got = cost.run_costs([cost.Attempt(*row) for row in found], completed, {STAGE: PRICES})
    assert [got[k] for k in ("billed_calls", "used", "failed", "paid_twice")] == [completed, completed, 0, 0]
    assert got["tokens_input_per_request"] == pytest.approx(served["tokens_input"] / completed)
    assert got["tokens_output_per_request"] == pytest.approx(served["tokens_output"] / completed)
    paid = served["tokens_input"] / 1000 * 0.5 + served["tokens_output"] / 1000 * 1.5
    assert got["cost_per_1k_requests"] == pytest.approx(paid / completed * 1000)
