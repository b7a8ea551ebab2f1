"""The capacity as the binding limit (measure.capacity) on hand-built inputs; every expected
figure is worked out in the comments, not with the module's formula."""

from __future__ import annotations

import pytest

from measure import capacity
from measure.capacity import BandWork, EndpointLimits, Limits

# A text_moderation-like run: 100 posts settled, 20 blocked at moderate (rejected), 80 completed
# after summarize and classify answered in parallel. Each endpoint's own concurrency.
FAN_OUT = Limits({"moderate": EndpointLimits(4), "summarize": EndpointLimits(20),
                  "classify": EndpointLimits(16)},
                 {"moderate": "moderate", "summarize": "summarize", "classify": "classify"})
FAN_OUT_SERVICE = {"moderate": 0.5, "summarize": 2.0, "classify": 1.0}
FAN_OUT_CALLS = {"moderate": 100, "summarize": 80, "classify": 80}


def test_fan_out_with_a_share_blocked_at_the_first_endpoint() -> None:
    calls = capacity.calls_per_request(FAN_OUT_CALLS, 80)
    # moderate is called by every post, blocked or not: 100 calls / 80 completed = 1.25 per
    # completed request; each branch once per completed request.
    assert calls == {"moderate": 1.25, "summarize": 1.0, "classify": 1.0}
    got = capacity.capacity(FAN_OUT, FAN_OUT_SERVICE, calls)
    # moderate:  4 / (0.5 s x 1.25) = 6.4 completed requests/s
    # summarize: 20 / (2.0 s x 1)   = 10
    # classify:  16 / (1.0 s x 1)   = 16
    # The longest mean call (summarize, 10 rps) is not what binds, and charging moderate only
    # the completed posts' calls (4 / 0.5 s = 8 rps) would overstate it by the blocked share.
    assert got.rps == pytest.approx(6.4)
    assert got.binding_limit == "moderate.concurrency"
    assert {c.name: c.rps for c in got.candidates} == {
        "moderate.concurrency": pytest.approx(6.4), "summarize.concurrency": pytest.approx(10.0),
        "classify.concurrency": pytest.approx(16.0)}
    assert got.as_dict()["candidates"] == {"moderate.concurrency": 6.4, "summarize.concurrency": 10.0,
                                           "classify.concurrency": 16.0}


def test_an_endpoint_no_request_reached_limits_nothing() -> None:
    # every post blocked: nothing completed, so no capacity in completed requests
    assert capacity.calls_per_request({"moderate": 10}, 0) == {}
    got = capacity.capacity(FAN_OUT, FAN_OUT_SERVICE, {"moderate": 1.0})
    # only moderate was called: 4 / (0.5 s x 1) = 8 rps
    assert (got.rps, got.binding_limit) == (pytest.approx(8.0), "moderate.concurrency")
    assert len(got.candidates) == 1
    assert capacity.capacity(FAN_OUT, {}, {}).rps is None


# One endpoint `draft` called twice per completed request (50 completed, 100 calls), 0.5 s a call.
DRAFT = {"draft": "draft"}
DRAFT_SERVICE = {"draft": 0.5}
DRAFT_CALLS = {"draft": 2.0}


@pytest.mark.parametrize(("endpoint", "tokens", "rps", "binding"), [
    # concurrency: 8 / (0.5 s x 2) = 8 rps; 1200 requests a minute allow 1200 / 60 / 2 = 10
    (EndpointLimits(8, requests_per_minute=1200), {}, 8.0, "draft.concurrency"),
    # 600 requests a minute: 600 / 60 / 2 = 5 rps, under the concurrency's 8
    (EndpointLimits(8, requests_per_minute=600), {}, 5.0, "draft.requests_per_minute"),
    # 60,000 tokens a minute at 250 tokens a call: 60000 / 60 / (250 x 2) = 2 rps, under 5 and 8
    (EndpointLimits(8, requests_per_minute=600, tokens_per_minute=60_000, tokens="output"), {"draft": 250.0},
     2.0, "draft.tokens_per_minute"),
])
def test_each_limit_binds_in_turn(endpoint: EndpointLimits, tokens: dict[str, float], rps: float,
                                  binding: str) -> None:
    limits = Limits({"draft": endpoint}, DRAFT, tokens_per_call=tokens)
    got = capacity.capacity(limits, DRAFT_SERVICE, DRAFT_CALLS)
    assert (got.rps, got.binding_limit) == (pytest.approx(rps), binding)
    assert got.binding is not None and got.binding.reasoning.startswith(binding)


def test_budgets_are_per_real_scale_minute() -> None:
    # at time scale 0.1 a minute lasts 6 wall-clock seconds: 600 / 6 s / 2 calls = 50 rps, so
    # the concurrency's 8 rps binds
    limits = Limits({"draft": EndpointLimits(8, requests_per_minute=600)}, DRAFT, time_scale=0.1)
    got = capacity.capacity(limits, DRAFT_SERVICE, DRAFT_CALLS)
    assert (got.rps, got.binding_limit) == (pytest.approx(8.0), "draft.concurrency")
    assert got.as_dict()["candidates"]["draft.requests_per_minute"] == 50.0


def test_a_tokens_budget_without_tokens_per_call_is_named_unmeasured() -> None:
    limits = Limits({"draft": EndpointLimits(8, tokens_per_minute=1000)}, DRAFT)
    got = capacity.capacity(limits, DRAFT_SERVICE, DRAFT_CALLS)
    assert (got.rps, got.binding_limit) == (pytest.approx(8.0), "draft.concurrency")
    assert got.unmeasured == ["draft.tokens_per_minute"]


def test_stages_sharing_an_endpoint_add_their_work() -> None:
    # outline (1 s, once) and polish (0.5 s, twice) on one endpoint of 10 slots: 2 s of slot
    # time per request, 10 / 2 = 5 rps; its 900 requests a minute: 900 / 60 / 3 calls = 5 rps too,
    # and the concurrency, listed first, is named on a tie
    limits = Limits({"llm": EndpointLimits(10, requests_per_minute=900)}, {"outline": "llm", "polish": "llm"})
    got = capacity.capacity(limits, {"outline": 1.0, "polish": 0.5}, {"outline": 1.0, "polish": 2.0})
    assert (got.rps, got.binding_limit) == (pytest.approx(5.0), "llm.concurrency")


def test_tokens_per_call_counts_the_kind_the_budget_meters() -> None:
    assert capacity.tokens_per_call("input", 10, 1000, 3000) == 100.0
    assert capacity.tokens_per_call("output", 10, 1000, 3000) == 300.0
    assert capacity.tokens_per_call("total", 10, 1000, 3000) == 400.0
    assert capacity.tokens_per_call("total", 0, 0, 0) is None


def test_a_concurrency_schedule_moves_only_its_endpoint() -> None:
    calls = capacity.calls_per_request(FAN_OUT_CALLS, 80)
    # moderate at 4, then 8, then 12 slots: 6.4, 12.8, then 19.2; summarize's 10 stays as it is
    got = dict((c.name, schedule) for c, schedule in capacity.limit_schedules(
        FAN_OUT, FAN_OUT_SERVICE, calls, "moderate", [(0.0, 4), (10.0, 8), (20.0, 12)]))
    assert got["moderate.concurrency"] == [(0.0, pytest.approx(6.4)), (10.0, pytest.approx(12.8)),
                                           (20.0, pytest.approx(19.2))]
    assert got["summarize.concurrency"] == [(0.0, pytest.approx(10.0))]


def test_band_work_counts_call_seconds_inside_and_calls_started_inside_and_before() -> None:
    calls = [("a", 5.0, 12.0),   # 2 s inside (10 -> 12), started before
             ("a", 12.0, 15.0),  # 3 s, started inside
             ("a", 18.0, 25.0),  # 2 s (18 -> 20), started inside
             ("a", 1.0, 4.0),    # before the band, the first
             ("b", 9.0, 21.0)]   # 10 s, the whole band, started before
    assert capacity.band_work(calls, (10.0, 20.0)) == {
        "a": BandWork(busy_s=7.0, started=2, before=2, first_s=1.0),
        "b": BandWork(busy_s=10.0, started=0, before=1, first_s=9.0)}
    assert capacity.band_work(calls, None) == {}


@pytest.mark.parametrize(("endpoint", "tokens", "expected"), [
    # concurrency 10 over a 10 s band: 100 slot-seconds, 90 of them in calls
    (EndpointLimits(10), {}, 0.9),
    # 300 requests a minute = 5 a second: 50 in the band, 40 calls started in it (the first
    # minute's 300 and the 50 refilled until the band were spent before it: nothing left)
    (EndpointLimits(10, requests_per_minute=300), {}, 0.8),
    # 60,000 tokens a minute (binding: 60000 / 60 / (125 x 2) = 4 rps against the concurrency's
    # 10) = 1000 a second: 10,000 in the band; 40 calls x 125 tokens = 5000 (560 calls x 125 =
    # 70,000 tokens before it: the bucket's 60,000 and the 10,000 refilled, nothing left)
    (EndpointLimits(10, tokens_per_minute=60_000), {"draft": 125.0}, 0.5),
])
def test_utilization_is_the_binding_limits_share_used_in_the_band(
        endpoint: EndpointLimits, tokens: dict[str, float], expected: float) -> None:
    limits = Limits({"draft": endpoint}, DRAFT, tokens_per_call=tokens)
    cap = capacity.capacity(limits, DRAFT_SERVICE, DRAFT_CALLS)
    work = {"draft": BandWork(busy_s=90.0, started=40, before=560, first_s=0.0)}
    assert capacity.utilization(cap, limits, work, (10.0, 20.0)) == pytest.approx(expected)
    assert capacity.utilization(cap, limits, work, None) is None


def test_a_budgets_utilization_counts_what_its_allowance_held_when_the_band_began() -> None:
    # 300 requests a minute: 5 a second, a bucket of 300 full when the first call came at 0 s.
    # 200 calls started before the band (10 -> 20 s): the bucket held at most 300 + 5 x 10 - 200
    # = 150 at 10 s, and the band allows 5 x 10 + 150 = 200 calls; 80 started in it: 0.4 (80 /
    # 50 = 1.6 of the rate alone).
    limits = Limits({"draft": EndpointLimits(64, requests_per_minute=300)}, DRAFT)
    cap = capacity.capacity(limits, DRAFT_SERVICE, DRAFT_CALLS)
    assert cap.binding_limit == "draft.requests_per_minute"
    work = {"draft": BandWork(busy_s=30.0, started=80, before=200, first_s=0.0)}
    assert capacity.utilization(cap, limits, work, (10.0, 20.0)) == pytest.approx(0.4)
    # Never more than the bucket's depth: none started before, the first at 5 s: 300 left.
    early = {"draft": BandWork(busy_s=30.0, started=80, before=0, first_s=5.0)}
    assert capacity.utilization(cap, limits, early, (10.0, 20.0)) == pytest.approx(80 / 350)


def test_served_check_sets_the_services_count_beside_the_binding_limit() -> None:
    calls = capacity.calls_per_request(FAN_OUT_CALLS, 80)
    cap = capacity.capacity(FAN_OUT, FAN_OUT_SERVICE, calls)
    # moderate binds at 6.4 requests/s x 1.25 calls = 8 calls/s (4 slots / 0.5 s); the service
    # served 700 moderate calls in 100 s: 7 a second, 0.875 of it
    got = capacity.served_check(cap, calls, FAN_OUT, 700, 100.0)
    assert got == {"endpoint": "moderate", "served": 700, "window_s": 100.0, "served_rps": 7.0,
                   "limit_calls_rps": 8.0, "initial_allowance_calls": 0.0, "share_of_limit": 0.875}
    assert capacity.served_check(cap, calls, FAN_OUT, None, 100.0) is None


def test_served_check_counts_a_budgets_initial_allowance() -> None:
    # draft's 600 requests a minute at time scale 0.25 (a 15 s minute): 40 calls/s, and a bucket
    # of 600 full when the window begins. 2 calls a request: 20 requests/s, 300 requests at once.
    limits = Limits({"draft": EndpointLimits(64, requests_per_minute=600)}, DRAFT, time_scale=0.25)
    cap = capacity.capacity(limits, DRAFT_SERVICE, DRAFT_CALLS)
    assert (cap.binding_limit, cap.binding.allowance if cap.binding else None) == (
        "draft.requests_per_minute", pytest.approx(300.0))
    # The service served 2500 calls in 50 s: 50/s, 1.25 of the rate alone; the window allows
    # 40 x 50 + 600 = 2600 calls (52/s), of which 2500 are 0.9615.
    got = capacity.served_check(cap, DRAFT_CALLS, limits, 2500, 50.0)
    assert got == {"endpoint": "draft", "served": 2500, "window_s": 50.0, "served_rps": 50.0,
                   "limit_calls_rps": 52.0, "initial_allowance_calls": 600.0, "share_of_limit": 0.9615}


def test_a_tokens_budget_lower_than_every_other_limit_is_named_binding() -> None:
    # Only a tokens budget beside the slots: 8 / (0.5 s x 2) = 8 rps against 30,000 tokens a minute
    # at 200 total tokens a call: 30000 / 60 / (200 x 2) = 1.25 rps; its bucket holds 30000 / 400 =
    # 75 requests' tokens.
    limits = Limits({"draft": EndpointLimits(8, tokens_per_minute=30_000)}, DRAFT,
                    tokens_per_call={"draft": 200.0})
    got = capacity.capacity(limits, DRAFT_SERVICE, DRAFT_CALLS)
    assert (got.rps, got.binding_limit) == (pytest.approx(1.25), "draft.tokens_per_minute")
    assert got.binding is not None and got.binding.allowance == pytest.approx(75.0)
    assert got.unmeasured == []
    # With a requests budget too, above it (600 a minute: 5 rps), the tokens still bind.
    both = Limits({"draft": EndpointLimits(8, requests_per_minute=600, tokens_per_minute=30_000)}, DRAFT,
                  tokens_per_call={"draft": 200.0})
    assert capacity.capacity(both, DRAFT_SERVICE, DRAFT_CALLS).binding_limit == "draft.tokens_per_minute"


def test_a_fixed_periods_utilization_is_held_to_its_rate_alone() -> None:
    # 300 requests a clock minute at time scale 1: 5 a second, 50 over the 10 s band; 40 calls
    # started in it: 0.8, whatever the periods let through before it (nothing started before).
    limits = Limits({"draft": capacity.fixed_periods(EndpointLimits(64, requests_per_minute=300), 1.0)},
                    DRAFT)
    cap = capacity.capacity(limits, DRAFT_SERVICE, DRAFT_CALLS)
    assert cap.binding_limit == "draft.requests_per_minute"
    work = {"draft": BandWork(busy_s=30.0, started=40, before=0, first_s=5.0)}
    assert capacity.utilization(cap, limits, work, (10.0, 20.0)) == pytest.approx(0.8)
