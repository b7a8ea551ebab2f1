"""What a shipped spec's shape gives the capacity and the physical minimum: the AI calls around
each endpoint on a request's path (PipelineSpec.chain_around), and the capacity of the fan-out
spec text_moderation derived by hand."""

from __future__ import annotations

import pytest

from consumers.config import pipeline_spec
from consumers.runs.run_figures import limits_of
from measure import capacity

# Lognormal means: median x exp(sigma^2 / 2), sigma = ln(p99 / median) / 2.32635. Every
# text_moderation and support_tickets endpoint has p99 = 5 x its median: sigma = 1.60944 / 2.32635
# = 0.69183, exp(0.69183^2 / 2) = exp(0.23932) = 1.27038.
MODERATE = 0.3 * 1.27038  # 0.38111 s
SUMMARIZE = 1.2 * 1.27038  # 1.52446 s
CLASSIFY = 0.8 * 1.27038  # 1.01630 s


def test_the_chain_around_an_endpoint_leaves_its_own_call_out() -> None:
    image = pipeline_spec.load("genai_image")  # check (0.5 s, fixed) -> generate (3 s)
    assert image.chain_around("generate") == (0.5, 0.0)
    assert image.chain_around("check") == (0.0, 3.0)
    moderation = pipeline_spec.load("text_moderation")  # moderate -> {summarize, classify} -> join
    # summarize's and classify's calls follow moderate's, and join calls nothing after them
    assert moderation.chain_around("summarize") == (pytest.approx(MODERATE, abs=1e-4), 0.0)
    assert moderation.chain_around("classify") == (pytest.approx(MODERATE, abs=1e-4), 0.0)
    # after moderate, the slower of the two branches join waits for
    assert moderation.chain_around("moderate") == (0.0, pytest.approx(SUMMARIZE, abs=1e-4))
    tickets = pipeline_spec.load("support_tickets")  # triage (small, median 0.4 s) -> draft (large)
    assert tickets.chain_around("large_model") == (pytest.approx(0.4 * 1.27038, abs=1e-4), 0.0)
    with pytest.raises(KeyError):
        tickets.chain_around("nothing")


def test_a_requests_seconds_along_its_path_take_the_slowest_branch_where_stages_fan_out() -> None:
    moderation = pipeline_spec.load("text_moderation")
    # 0.3 at moderate, then 1.2 at summarize beside 2.0 at classify: the request waits 2.3 s
    assert moderation.path_s({"moderate": 0.3, "summarize": 1.2, "classify": 2.0}) == pytest.approx(2.3)
    assert moderation.path_s({"moderate": 0.3, "summarize": 2.5, "classify": 2.0}) == pytest.approx(2.8)
    assert moderation.path_s({"moderate": 0.4}) == pytest.approx(0.4)  # blocked: no branch
    image = pipeline_spec.load("genai_image")  # check -> generate, one after the other
    assert image.path_s({"check": 0.5, "generate": 3.1}) == pytest.approx(3.6)


def test_the_capacity_of_the_fan_out_spec_by_hand() -> None:
    spec = pipeline_spec.load("text_moderation")
    limits = limits_of(spec)  # 64 slots on each of moderate, summarize and classify
    # 1000 posts, 200 blocked at moderate: per post, moderate is called once and each branch
    # 0.8 times; per completed post (800), moderate 1000 / 800 = 1.25 times, each branch once.
    calls = capacity.calls_per_request({"moderate": 1000, "summarize": 800, "classify": 800}, 800)
    assert calls == {"moderate": 1.25, "summarize": 1.0, "classify": 1.0}
    service = {"moderate": MODERATE, "summarize": SUMMARIZE, "classify": CLASSIFY}
    got = capacity.capacity(limits, service, calls)
    # moderate:  64 / (0.38111 s x 1.25) = 134.35 completed posts/s
    # summarize: 64 / 1.52446 s            = 41.982
    # classify:  64 / 1.01630 s            = 62.973
    # The branches run in parallel: the slower one's endpoint binds, not the sum of the path.
    assert got.as_dict()["candidates"] == {"moderate.concurrency": pytest.approx(134.35, abs=0.01),
                                           "summarize.concurrency": pytest.approx(41.982, abs=0.001),
                                           "classify.concurrency": pytest.approx(62.973, abs=0.001)}
    assert (got.binding_limit, got.rps) == ("summarize.concurrency", pytest.approx(41.982, abs=1e-3))
