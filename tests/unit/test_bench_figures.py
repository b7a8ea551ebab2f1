"""The benchmark's limit figures (bench.figures.limit_figures) on a hand-built text_moderation run."""

from __future__ import annotations

import pytest

from bench import figures
from consumers.config.presets import PresetParams
from measure import capacity


def counters(served: int) -> dict[str, int]:
    return {"served": served, "rejected_429": 0, "rate_limited": 0, "rate_limited_requests": 0,
            "rate_limited_tokens": 0, "errors_5xx": 0, "hangs": 0}


def test_the_physical_minimum_and_the_stand_ins_count_follow_the_binding_limit() -> None:
    p = PresetParams(pipeline="text_moderation", concurrency=4, time_scale=1.0)
    # 100 posts, 20 blocked: moderate called 100 times, summarize and classify 80 each
    result = {"completed": 80, "produced": 100, "span_s": 50.0, "first_produced_s": 1000.0,
              "service_s": {"moderate": 0.5, "summarize": 2.0, "classify": 1.0},
              "calls_per_request": {"moderate": 1.25, "summarize": 1.0, "classify": 1.0},
              "ai_service": {"moderate": counters(100), "summarize": counters(80), "classify": counters(80)}}
    got = figures.limit_figures(result, p, [(0.0, 4)], applied_at=1000.0)
    # moderate 4 / (0.5 s x 1.25) = 6.4, summarize 4 / 2 s = 2, classify 4 / 1 s = 4 requests/s:
    # 80 completed at 2/s take 40 s of summarize's calls, after moderate's call at the spec's mean
    # latency (lognormal, median 0.3 s, p99 5 x the median: sigma = ln 5 / 2.3263, mean = median x
    # exp(sigma^2 / 2)); join calls nothing after summarize. moderate's own bound, 80 / 6.4 = 12.5 s
    # + summarize's mean after it (1.2 x 1.2704 = 1.5245 s), and classify's, 20 s + 0.381 s, are lower.
    # sigma = 1.609438 / 2.326348 = 0.691830, sigma^2 / 2 = 0.239315, exp of it 1.270378:
    # 40 + 0.3 x 1.270378 = 40.381113 s, and 50 / 40.381113 = 1.238203
    assert got["physical_minimum_s"] == pytest.approx(40.3811, abs=1e-3)
    assert got["minimum_limit"] == "summarize.concurrency"
    assert got["span_over_minimum"] == pytest.approx(1.2382, abs=1e-4)
    # the stand-in served 80 summarize calls over the 50 s span: 1.6/s of the 2/s its 4 slots allow
    assert got["served_on_binding"] == {"endpoint": "summarize", "served": 80, "window_s": 50.0,
                                        "served_rps": 1.6, "limit_calls_rps": 2.0,
                                        "initial_allowance_calls": 0.0, "share_of_limit": 0.8}
    assert (got["ai_calls"], got["ai_429"]) == (260, 0)


# text_moderation at time scale 0.25 (a minute of 15 s) with a tokens budget on summarize set over
# the spec's (`--stand-in '{"summarize": {"tokens_per_minute": 30000}}'`): 1250 posts, 250 blocked.
TOKENS = PresetParams(pipeline="text_moderation", concurrency=64, time_scale=0.25,
                      endpoint_settings={"summarize": {"tokens_per_minute": 30_000}})
BUDGETS = {"requests_per_minute": None, "tokens_per_minute": None, "tokens": "total"}


def tokens_run(counted: bool) -> dict:
    summarize = {**counters(1000), "config": {**BUDGETS, "tokens_per_minute": 30_000}}
    if counted:  # 150,000 input and 50,000 output tokens: 200 tokens a call
        summarize = {**summarize, "tokens_input": 150_000, "tokens_output": 50_000}
    return {"completed": 1000, "produced": 1250, "span_s": 90.0, "first_produced_s": 1000.0,
            "service_s": {"moderate": 0.1, "summarize": 0.4, "classify": 0.25},
            "calls_per_request": {"moderate": 1.25, "summarize": 1.0, "classify": 1.0},
            "ai_service": {"moderate": {**counters(1250), "config": BUDGETS}, "summarize": summarize,
                           "classify": {**counters(1000), "config": BUDGETS}}}


def test_a_tokens_budget_that_binds_is_named_and_held_to_with_its_allowance() -> None:
    result = tokens_run(counted=True)
    limits = figures.bench_limits(TOKENS, result["ai_service"])
    cap = capacity.capacity(limits, result["service_s"], result["calls_per_request"])
    # 30,000 tokens per 15 s = 2000 tokens/s, 200 a call: 10 calls/s, 1 a request: 10 rps, under
    # the slots' 64 / 0.4 s = 160 (summarize), 64 / (0.1 s x 1.25) = 512 (moderate), 64 / 0.25 s = 256
    assert (cap.binding_limit, cap.rps) == ("summarize.tokens_per_minute", pytest.approx(10.0))
    got = figures.limit_figures(result, TOKENS, [(0.0, 64)], applied_at=1000.0)
    # The bucket holds 30,000 tokens at the start: 150 calls at once. 1000 calls: moderate's mean
    # call before (0.3 s x 1.2704 x 0.25 = 0.0953 s), 850 at 10/s = 85 s, then the last call's
    # 0.4 s: 85.4953 s.
    assert got["minimum_limit"] == "summarize.tokens_per_minute"
    assert got["physical_minimum_s"] == pytest.approx(85.4953, abs=1e-3)
    assert got["span_over_minimum"] == pytest.approx(90 / 85.4953, abs=1e-4)
    # 1000 served in 90 s, of 10 x 90 + 150 = 1050 the budget allows over it (11.667/s)
    assert got["served_on_binding"] == {"endpoint": "summarize", "served": 1000, "window_s": 90.0,
                                        "served_rps": 11.111, "limit_calls_rps": 11.667,
                                        "initial_allowance_calls": 150.0, "share_of_limit": 0.9524}


def test_a_budgets_refusals_count_among_the_429s() -> None:
    result = tokens_run(counted=True)
    result["ai_service"]["summarize"].update(rejected_429=3, rate_limited_tokens=40, rate_limited_requests=2)
    got = figures.limit_figures(result, TOKENS, [(0.0, 64)], applied_at=1000.0)
    # 45 refused beside 1250 + 1000 + 1000 served: 45 of 3295 calls
    assert (got["ai_calls"], got["ai_429"]) == (3295, 45)
    assert got["overload_share"] == pytest.approx(45 / 3295, abs=1e-5)


def test_a_tokens_budget_without_counted_tokens_is_left_out_not_named() -> None:
    result = tokens_run(counted=False)
    limits = figures.bench_limits(TOKENS, result["ai_service"])
    cap = capacity.capacity(limits, result["service_s"], result["calls_per_request"])
    # no tokens per call: the budget is named unmeasured, and summarize's slots (160 rps) bind
    assert (cap.binding_limit, cap.unmeasured) == ("summarize.concurrency", ["summarize.tokens_per_minute"])
