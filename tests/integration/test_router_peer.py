"""The Router peer (bench/peer.py sending through bench/router_peer.py, in LiteLLM's environment)
against a stand-in of its own, with a model whose requests per minute bind: 60 requests, 16 at
once, under 40 a minute. Router lets 40 through, refuses the try each worker makes next and
tries those again once the minute has turned; every outcome agrees with what the stand-in says
it served.

The stand-in is this module's own (a model held to 40 calls a minute would refuse the other
tests' calls), at a fixed 20 ms, so the first minute's tries take a few seconds. LiteLLM counts
per clock minute: the peer starts sending when one turns (`at_minute`), once its process has
imported LiteLLM (10 s and more on a loaded machine). Started before, a first minute that turned
under the requests served all 60 without a refusal. The wait for the minute and the retries'
60 s (what Router's refusal asks for) make the test take one to two minutes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import requests

from bench import peer
from consumers.stand_in.config import EndpointConfig, ServiceConfig
from consumers.stand_in.server import serve
from infra.ai_gateway import Model

MODEL = Model("peer-small", rpm=40, tpm=1_000_000, input_cost_per_token=0.0, output_cost_per_token=0.0)
CHAT = EndpointConfig(path="/v1/chat/completions", protocol="openai_chat", latency_s=0.02,
                      answers=({"when": {}, "body": {"content": "billing"}},))
WORKERS = 16
REQUESTS = [{"model": MODEL.name, "messages": [{"role": "user", "content": f"Ticket {i}: refund please"}],
             "max_tokens": 4, "temperature": 0, "user": f"ticket-{i}"} for i in range(60)]


@pytest.fixture(scope="module")
def stand_in() -> Iterator[str]:
    server = serve(ServiceConfig({"chat": CHAT}), port=0)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_routers_outcomes_agree_with_what_the_stand_in_served(stand_in: str) -> None:
    result = peer.send(REQUESTS, MODEL, stand_in, WORKERS, at_minute=True)
    served = requests.get(f"{stand_in}/v1/stats", timeout=5).json()["chat"]
    totals, records = result["totals"], result["requests"]
    # 40 served in the first minute; then each of the 16 workers is refused once and waits; in
    # the next minute its request and the 4 left are served: 60 answered, 60 + 16 calls.
    assert {k: totals[k] for k in ("requests", "ok", "rate_limited", "error", "refused_429", "calls")} == {
        "requests": 60, "ok": 60, "rate_limited": 0, "error": 0, "refused_429": WORKERS,
        "calls": 60 + WORKERS}
    assert Counter(r["tries"] for r in records) == {1: 60 - WORKERS, 2: WORKERS}
    # Router's refusals never reached the stand-in: it served each request once, and only them.
    assert {k: served[k] for k in ("served", "distinct_served", "duplicate_served", "rejected_429")} == \
        {"served": 60, "distinct_served": 60, "duplicate_served": 0, "rejected_429": 0}
    retried = sorted(r["ended"] for r in records if r["tries"] == 2)
    first = sorted(r["ended"] for r in records if r["tries"] == 1)[:40]
    assert retried[0] - first[-1] >= 55  # the retries waited for the next minute
