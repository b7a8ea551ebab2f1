"""The Router peer (bench/peer.py, bench/router_peer.py): its figures from a hand-written result,
the requests it renders, and what the program in LiteLLM's environment may import."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from bench import peer
from consumers.config import pipeline_spec
from infra.ai_gateway import Model
from pipelines.support_tickets import TICKETS

# 30 requests a minute, 3,000 tokens a minute; prices play no part here.
MODEL = Model("small-model", rpm=30, tpm=3000, input_cost_per_token=0.0, output_cost_per_token=0.0)


def answered(ended: float, tries: int = 1) -> dict:
    """An answered request: its last call took 0.5 s, 40 tokens in and 10 out."""
    return {"started": 1000.0, "ended": ended, "outcome": "ok", "tries": tries, "refused": tries - 1,
            "call_s": 0.5, "tokens_input": 40, "tokens_output": 10}


# As bench/router_peer.py writes it: 4 workers from t = 1000 s; 12 answers, one every 4 s from
# 1004 to 1048 (the last two after one refusal each), one request rate-limited after its 3
# retries (4 refusals, ended at 1050) and one error at once.
RESULT = {
    "started": 1000.0, "workers": 4, "retries": 3,
    "requests": [*(answered(1000.0 + 4 * i) for i in range(1, 11)), answered(1044.0, 2), answered(1048.0, 2),
                 {"started": 1000.0, "ended": 1050.0, "outcome": "rate_limited", "tries": 4, "refused": 4},
                 {"started": 1000.0, "ended": 1002.0, "outcome": "error", "tries": 1, "refused": 0}],
    "totals": {"requests": 14, "calls": 19, "ok": 12, "rate_limited": 1, "error": 1, "refused_429": 6,
               "span_s": 50.0},
}


def test_the_peers_figures_are_the_standard_ones_held_to_the_gateways_limits() -> None:
    got = peer.peer_figures(RESULT, "triage", "small_model", MODEL, {"served": 12, "duplicate_served": 0})
    # The limits, in requests/s (a Router minute is 60 wall-clock seconds): 4 workers / 0.5 s = 8,
    # 30 / 60 = 0.5, 3000 / 60 / 50 tokens = 1: the requests per minute bind.
    assert got["capacity_candidates"] == {"small_model.concurrency": 8.0,
                                          "small_model.requests_per_minute": 0.5,
                                          "small_model.tokens_per_minute": 1.0}
    assert (got["binding_limit"], got["capacity_rps"]) == ("small_model.requests_per_minute", 0.5)
    # Answers at 1004, 1008, ..., 1048: the steady band runs from the 3rd (round(0.2 x 11) = 2)
    # to the 10th (round(0.8 x 11) = 9), 1012 to 1040 s, one answer every 4 s; 7 calls start in
    # its 28 s (at 1015.5, 1019.5, ..., 1039.5), against 0.5 x 28 = 14 the limit allows (a fixed
    # window's budget: its rate alone).
    assert got["steady_throughput_rps"] == 0.25
    assert got["utilization"] == pytest.approx(7 / 14, abs=1e-4)
    # Span from the start to the last end (the rate-limited request at 1050): 12 answers / 50 s.
    assert (got["span_s"], got["throughput_rps"]) == (50.0, 0.24)
    assert (got["produced"], got["completed"], got["lost"]) == (14, 12, 0)
    assert got["status"] == {"completed": 12, "dead_lettered": 2}
    # Latency from the start: 4, 8, ..., 48 s; the median between the 6th and 7th (26 s), p95 at
    # rank 10.45 (44 + 0.45 x 4 = 45.8 s), p99 at rank 10.89 (47.56 s).
    assert (got["p50_ms"], got["p95_ms"], got["p99_ms"]) == (26000.0, 45800.0, 47560.0)
    # 2 + 4 refusals of 19 calls; the stand-in served 12 in 50 s. Router's budget is a fixed window
    # of a clock minute: over 50 s the end of one window and the start of the next may pass 30
    # each at once, beside the 0.5/s: 0.5 x 50 + 60 = 85 calls (1.7/s), 12 of them 0.1412.
    assert (got["ai_calls"], got["ai_429"], got["overload_share"]) == (19, 6, round(6 / 19, 5))
    assert got["overload_by_endpoint"] == {"small_model": {"ai_calls": 19, "ai_429": 6,
                                                           "overload_share": round(6 / 19, 5)}}
    assert got["served_on_binding"] == {"endpoint": "small_model", "served": 12, "window_s": 50.0,
                                        "served_rps": 0.24, "limit_calls_rps": 1.7,
                                        "initial_allowance_calls": 60.0, "share_of_limit": 0.1412}
    assert got["peer"]["outcomes"] == {"ok": 12, "rate_limited": 1, "error": 1}
    assert got["completion_times"] == [1000.0 + 4 * i for i in range(1, 13)]


def test_the_peer_sends_the_triage_stages_chat_requests_as_the_platform_renders_them() -> None:
    spec = pipeline_spec.load("support_tickets")
    assert peer.chat_stage(spec) == "triage"
    sent = peer.chat_requests(spec, "triage", 3, "run-1")
    tickets = {f"{subject}\n\n{body}" for subject, body in TICKETS}
    for request in sent:
        assert {k: request[k] for k in ("model", "max_tokens", "temperature")} == \
            {"model": "small-model", "max_tokens": 4, "temperature": 0}
        assert [m["role"] for m in request["messages"]] == ["system", "user"]
        assert request["messages"][1]["content"] in tickets
    assert len({request["user"] for request in sent}) == 3  # each its ticket's id
    assert peer.gateway_model("small-model").rpm == 600


def test_a_pipeline_without_a_chat_stage_has_no_peer() -> None:
    with pytest.raises(ValueError, match="no stage fed by its load that makes an openai_chat call"):
        peer.chat_stage(pipeline_spec.load("genai_image"))


def test_the_router_program_imports_only_the_standard_library_and_litellm() -> None:
    # It runs in LiteLLM's environment, where none of the project's dependencies are.
    tree = ast.parse(Path(peer.__file__).with_name("router_peer.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - set(sys.stdlib_module_names) == {"litellm"}
