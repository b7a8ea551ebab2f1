"""The shared-quota benchmark's reading of the stand-in's account counters, worked by hand."""

from __future__ import annotations

import pytest

from bench.quota_lab import in_flight, write_pipelines
from bench.shared_quota import figures
from consumers.config import pipeline_spec


def reading(busy: tuple[float, float, float], requests: tuple[int, int, int], over_quota: int = 0) -> dict:
    names = ("tenant_a", "tenant_b", "tenant_c")
    return {"over_quota": over_quota, "max_in_flight": 48, "callers": {
        name: {"busy_s": b, "requests": r, "served": r, "refused": {"concurrency": 0},
               "tokens_input": 40 * r, "tokens_output": 10 * r}
        for name, b, r in zip(names, busy, requests, strict=True)}}


def test_mean_calls_in_flight_over_the_window_against_the_weighted_shares() -> None:
    # 40 s: a was busy 960 call-seconds (24 at once), b 480 (12), c 400 (10) of a quota of 48
    # shared 2 : 1 : 1 (24, 12, 12): shares of fair 1, 1, 0.833; used 46/48.
    first, last = reading((100, 50, 50), (0, 0, 0)), reading((1060, 530, 450), (300, 150, 130), over_quota=2)
    result = figures(first, last, 40.0, "concurrency", 48.0, time_scale=1.0)
    assert result["used"] == pytest.approx({"tenant_a": 24, "tenant_b": 12, "tenant_c": 10})
    assert result["share_of_fair"] == pytest.approx({"tenant_a": 1.0, "tenant_b": 1.0, "tenant_c": 10 / 12})
    assert result["quota_used"] == pytest.approx(46 / 48)
    # Jain over 12, 12, 10: 34^2 / (3 x 388) = 1156 / 1164
    assert result["weighted_jain"] == pytest.approx(1156 / 1164)
    assert result["over_quota"] == 2 and result["served"] == 580


def test_requests_a_minute_of_the_endpoint_s_clock() -> None:
    # 30 s at time scale 0.5 (a minute lasts 30 s): 300, 150 and 150 requests are 300, 150, 150
    # a minute of a quota of 600.
    first, last = reading((0, 0, 0), (0, 0, 0)), reading((0, 0, 0), (300, 150, 150))
    result = figures(first, last, 30.0, "requests", 600.0, time_scale=0.5)
    assert result["used"] == pytest.approx({"tenant_a": 300, "tenant_b": 150, "tenant_c": 150})
    assert result["quota_used"] == pytest.approx(1.0)


def test_calls_in_flight_between_readings() -> None:
    series = [(0.0, {"tenant_a": 0.0, "tenant_b": 0.0, "tenant_c": 0.0}),
              (0.5, {"tenant_a": 12.0, "tenant_b": 6.0, "tenant_c": 0.0})]
    assert in_flight(series) == [(0.5, {"tenant_a": 24.0, "tenant_b": 12.0, "tenant_c": 0.0})]


def test_the_tenants_spend_one_quota_with_their_weights(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PIPELINES_DIR", str(write_pipelines(tmp_path, "concurrency")))
    quota = pipeline_spec.load_quota("lab")
    assert quota.concurrency == 48
    assert {name: quota.share_of(name).weight for name in ("tenant_a", "tenant_b", "tenant_c")} == \
        {"tenant_a": 2.0, "tenant_b": 1.0, "tenant_c": 1.0}
    assert pipeline_spec.load("tenant_b").endpoints["generate"].quota == "lab"


def test_tokens_a_minute_count_the_prompt_and_the_answer() -> None:
    # 60 s at time scale 1: 240, 120 and 120 requests of 40 + 10 tokens: 12,000, 6,000, 6,000
    # tokens a minute of a quota of 24,000, all of it.
    first, last = reading((0, 0, 0), (0, 0, 0)), reading((0, 0, 0), (240, 120, 120))
    result = figures(first, last, 60.0, "tokens", 24_000.0, time_scale=1.0)
    assert result["used"] == pytest.approx({"tenant_a": 12_000, "tenant_b": 6_000, "tenant_c": 6_000})
    assert result["quota_used"] == pytest.approx(1.0)
