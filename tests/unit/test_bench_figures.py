"""The benchmark's limit figures (bench.figures.limit_figures) on a hand-built text_moderation run."""

from __future__ import annotations

import math

import pytest

from bench import figures
from consumers.config.presets import PresetParams


def counters(served: int) -> dict[str, int]:
    return {"served": served, "rejected_429": 0, "rate_limited": 0, "errors_5xx": 0, "hangs": 0}


def test_the_physical_minimum_and_the_stand_ins_count_follow_the_binding_limit() -> None:
    p = PresetParams(pipeline="text_moderation", concurrency=4, time_scale=1.0)
    # 100 posts, 20 blocked: moderate called 100 times, summarize and classify 80 each
    result = {"completed": 80, "produced": 100, "span_s": 50.0, "first_produced_s": 1000.0,
              "service_s": {"moderate": 0.5, "summarize": 2.0, "classify": 1.0},
              "calls_per_request": {"moderate": 1.25, "summarize": 1.0, "classify": 1.0},
              "ai_service": {"moderate": counters(100), "summarize": counters(80), "classify": counters(80)}}
    got = figures.limit_figures(result, p, [(0.0, 4)], applied_at=1000.0)
    # moderate 4 / (0.5 s x 1.25) = 6.4, summarize 4 / 2 s = 2, classify 4 / 1 s = 4 requests/s:
    # 80 completed at 2/s take 40 s, plus one chain moderate -> summarize at the spec's mean
    # latencies: lognormal medians 0.3 and 1.2 s with p99 5 x the median, sigma = ln 5 / 2.3263,
    # mean = median x exp(sigma^2 / 2)
    sigma = math.log(5) / 2.3263478740408408
    minimum = 40 + 1.5 * math.exp(sigma ** 2 / 2)
    assert got["physical_minimum_s"] == pytest.approx(minimum, abs=1e-3)
    assert got["span_over_minimum"] == pytest.approx(50 / minimum, abs=1e-4)
    # the stand-in served 80 summarize calls over the 50 s span: 1.6/s of the 2/s its 4 slots allow
    assert got["served_on_binding"] == {"endpoint": "summarize", "served": 80, "window_s": 50.0,
                                        "served_rps": 1.6, "limit_calls_rps": 2.0, "share_of_limit": 0.8}
    assert (got["ai_calls"], got["ai_429"]) == (260, 0)
