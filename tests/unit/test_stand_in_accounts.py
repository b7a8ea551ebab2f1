"""The stand-in's provider accounts: one meter shared by the endpoints naming it, and counters per
caller, hand-computed on an injected clock, then over real HTTP."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from prometheus_client import generate_latest

from consumers.config.pipeline_spec import SpecError, load
from consumers.stand_in.accounts import Claim
from consumers.stand_in.config import AccountConfig, ConfigError, EndpointConfig, ServiceConfig
from consumers.stand_in.endpoint import Refusal
from consumers.stand_in.server import serve
from consumers.stand_in.service import StandIn
from tests.hand_clock import HandClock

ANSWERS = ({"when": {}, "body": {"answer": "ok {request_id}"}},)
A = EndpointConfig(path="/v1/a", required=("request_id",), answers=ANSWERS, latency_s=1.0, limit=10,
                   account="acme")
B = replace(A, path="/v1/b")
BODY = json.dumps({"request_id": "r-1"}).encode()  # "r-1": 1 token in; "r-1" + "ok r-1": 3 out
NO_REFUSALS = {"concurrency": 0, "requests": 0, "tokens": 0}



def service(clock: HandClock, account: dict[str, Any], **changes: dict[str, Any]) -> StandIn:
    """Endpoints a and b on account acme, with EndpointConfig changes per endpoint name."""
    endpoints = {name: replace(config, **changes.get(name, {})) for name, config in (("a", A), ("b", B))}
    accounts = {"acme": AccountConfig(name="acme", **account)}
    return StandIn(ServiceConfig(endpoints, accounts=accounts), clock=clock)


def admit(standin: StandIn, name: str, caller: str = "-", input_tokens: int = 0, output_tokens: int = 0,
          scale: float = 1.0) -> tuple[EndpointConfig | Refusal, Claim]:
    """One call's admission on endpoint `name`, through acme's meter, as the service admits it."""
    claim = standin.accounts["acme"].claim(caller, input_tokens, output_tokens)
    return standin.endpoints[name].admit(scale, input_tokens, output_tokens, claim), claim


def release(standin: StandIn, name: str, claim: Claim) -> None:
    standin.endpoints[name].release()
    claim.account.release(claim)


def test_the_fourth_call_at_once_across_two_endpoints_is_over_quota_and_charged_nothing() -> None:
    clock = HandClock()
    standin = service(clock, {"concurrency": 3, "requests_per_minute": 60}, b={"requests_per_minute": 60})
    held = [admit(standin, name) for name in ("a", "a", "b")]
    assert all(isinstance(config, EndpointConfig) for config, _ in held)
    refused, _ = admit(standin, "b")  # b has 9 slots of its own left; the account has none
    assert refused == Refusal("rejected_429", 1.0)  # Retry-After: b's latency, as for its own slots
    assert isinstance(refused, Refusal) and refused.kind == "concurrency"
    assert refused.message == "too many concurrent requests (account acme)"
    # The account's bucket over b's own: 57 of 60 left for everyone (b's own has 59).
    assert refused.headers["x-ratelimit-remaining-requests"] == "57"
    stats = standin.stats()
    acme = stats["accounts"]["acme"]
    assert (acme["over_quota"], acme["requests"], acme["refused"], acme["in_flight"]) == \
        (1, 4, {**NO_REFUSALS, "concurrency": 1}, 3)
    assert (stats["b"]["rejected_429"], stats["b"]["in_flight"], stats["a"]["in_flight"]) == (1, 1, 2)
    assert standin.endpoints["b"].budget_headers(1.0)["x-ratelimit-remaining-requests"] == "59"
    assert standin.accounts["acme"].headers(1.0)["x-ratelimit-remaining-requests"] == "57"
    release(standin, "a", held[0][1])
    assert isinstance(admit(standin, "b")[0], EndpointConfig)  # the account's slot came back
    assert standin.stats()["accounts"]["acme"]["max_in_flight"] == 3


def test_calls_on_both_endpoints_from_many_threads_never_exceed_the_account_nor_deadlock() -> None:
    standin = StandIn(ServiceConfig({"a": A, "b": B}, accounts={"acme": AccountConfig(name="acme",
                                                                                     concurrency=3)}))

    def calls(i: int) -> None:
        for n in range(300):
            config, claim = admit(standin, "ab"[(i + n) % 2], f"c{i % 2}")
            if isinstance(config, EndpointConfig):
                release(standin, "ab"[(i + n) % 2], claim)

    def reconfigures() -> None:  # the account's lock taken alone, beside the endpoints' admissions
        for n in range(300):
            standin.update({"accounts": {"acme": {"concurrency": 3}}, "limit": 10 + n % 2})
            standin.stats()

    threads = [threading.Thread(target=calls, args=(i,)) for i in range(6)]
    threads.append(threading.Thread(target=reconfigures))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    acme = standin.stats()["accounts"]["acme"]
    assert (acme["requests"], acme["in_flight"]) == (1800, 0) and acme["max_in_flight"] <= 3
    assert acme["over_quota"] == acme["refused"]["concurrency"]
    assert {c["requests"] for c in acme["callers"].values()} == {900}


def test_a_requests_budget_is_one_bucket_for_the_account_s_endpoints() -> None:
    clock = HandClock()
    standin = service(clock, {"requests_per_minute": 15})
    scale = 0.5  # 15 per minute is 0.25 per real-scale second: 0.5 per wall second at 0.5x
    assert all(isinstance(admit(standin, "ab"[i % 2], scale=scale)[0], EndpointConfig) for i in range(15))
    refused, _ = admit(standin, "a", scale=scale)
    assert refused == Refusal("rate_limited_requests", 2.0)  # one request at 0.5 per second
    assert isinstance(refused, Refusal) and refused.kind == "requests"
    assert refused.headers == {"x-ratelimit-limit-requests": "15", "x-ratelimit-remaining-requests": "0",
                               "x-ratelimit-reset-requests": "30s"}  # 15 at 0.5 per second
    clock.now = 1.0  # half a request back
    assert admit(standin, "b", scale=scale)[0] == Refusal("rate_limited_requests", 1.0)
    clock.now = 2.0  # a whole one
    assert isinstance(admit(standin, "b", scale=scale)[0], EndpointConfig)
    assert admit(standin, "a", scale=scale)[0] == Refusal("rate_limited_requests", 2.0)
    stats = standin.stats()
    acme = stats["accounts"]["acme"]
    assert (acme["over_quota"], acme["refused"]["requests"]) == (3, 3)
    assert (stats["a"]["rate_limited_requests"], stats["b"]["rate_limited_requests"]) == (2, 1)
    assert (stats["a"]["in_flight"], stats["b"]["in_flight"]) == (8, 8)


def test_the_account_s_tokens_are_charged_the_estimate_and_corrected_to_the_answer() -> None:
    clock = HandClock()
    standin = service(clock, {"tokens_per_minute": 600})  # 10 tokens per second at 1x
    account = standin.accounts["acme"]
    config, claim = admit(standin, "a", input_tokens=100, output_tokens=400)
    assert isinstance(config, EndpointConfig)
    assert account.headers(1.0) == {"x-ratelimit-limit-tokens": "600", "x-ratelimit-remaining-tokens": "100",
                                    "x-ratelimit-reset-tokens": "50s"}  # 500 at 10 per second
    refused, _ = admit(standin, "b", input_tokens=100, output_tokens=100)  # 200 needed, 100 there
    assert refused == Refusal("rate_limited_tokens", 10.0)
    clock.now = 2.0  # 100 + 20 refilled, and 360 of the 400 estimated back: the answer took 40
    account.correct(claim, 40, 1.0)
    assert account.headers(1.0)["x-ratelimit-remaining-tokens"] == "480"
    assert account.headers(1.0)["x-ratelimit-reset-tokens"] == "12s"
    account.reconfigure(replace(account.config, tokens_per_minute=1200))  # a new budget: full
    assert isinstance(admit(standin, "b", input_tokens=100, output_tokens=100)[0], EndpointConfig)
    account.correct(claim, 0, 1.0)  # 400 of the old budget's charge back: the new one never took it
    assert account.headers(1.0)["x-ratelimit-remaining-tokens"] == "1000"


def test_busy_s_integrates_each_caller_s_calls_in_flight_over_time() -> None:
    clock = HandClock()
    standin = service(clock, {"concurrency": 3})
    account = standin.accounts["acme"]
    _, alice_1 = admit(standin, "a", "alice")  # t=0
    clock.now = 1.0
    _, bob = admit(standin, "b", "bob")
    clock.now = 2.0
    _, alice_2 = admit(standin, "b", "alice")
    clock.now = 2.5
    assert admit(standin, "a", "carol")[0] == Refusal("rejected_429", 1.0)  # 3 in flight already
    clock.now = 3.0
    callers = account.snapshot()["callers"]
    # alice: 1 call over [0, 2), 2 over [2, 3): 2 + 2; bob: 1 over [1, 3); the account: 1 + 2 + 3.
    assert {name: c["busy_s"] for name, c in callers.items()} == {"alice": 4.0, "bob": 2.0, "carol": 0.0}
    assert account.snapshot()["busy_s"] == 6.0
    clock.now = 4.0
    release(standin, "a", alice_1)
    clock.now = 5.0
    release(standin, "b", bob)
    clock.now = 7.0
    release(standin, "b", alice_2)
    clock.now = 10.0  # nothing in flight since 7: nothing more accrues
    snapshot = account.snapshot()
    callers = snapshot["callers"]
    # alice: 2 (1 x [0, 2)) + 4 (2 x [2, 4)) + 3 (1 x [4, 7)); bob: 4 (1 x [1, 5)).
    assert {name: (c["busy_s"], c["max_in_flight"], c["in_flight"]) for name, c in callers.items()} == \
        {"alice": (9.0, 2, 0), "bob": (4.0, 1, 0), "carol": (0.0, 0, 0)}
    # 1 x [0, 1) + 2 x [1, 2) + 3 x [2, 4) + 2 x [4, 5) + 1 x [5, 7): alice's and bob's together.
    assert (snapshot["busy_s"], snapshot["max_in_flight"], snapshot["over_quota"]) == (13.0, 3, 1)
    assert (callers["carol"]["requests"], callers["carol"]["refused"]) == \
        (1, {**NO_REFUSALS, "concurrency": 1})


def test_answers_show_the_account_s_remaining_and_over_quota_counts_its_own_refusals_only() -> None:
    clock = HandClock()  # never advanced: nothing refills
    standin = service(clock, {"requests_per_minute": 5, "tokens_per_minute": 600},
                      a={"latency_s": 0.0, "requests_per_minute": 2}, b={"latency_s": 0.0})
    capped = json.dumps({"request_id": "r-1", "max_tokens": 50}).encode()
    answers = [standin.call(name, None, capped, "alice") for name in ("a", "b", "a", "a")]
    assert [r.status for r in answers] == [200, 200, 200, 429]
    # The account's bucket, not a's own (1, then 0 left of its 2); b meters nothing itself.
    assert [r.headers["x-ratelimit-remaining-requests"] for r in answers] == ["4", "3", "2", "2"]
    assert {r.headers["x-ratelimit-limit-requests"] for r in answers} == {"5"}
    # Each answer charged 1 + 50 (max_tokens), corrected to 1 + 3 (its answer's): 4 a call.
    assert [r.headers["x-ratelimit-remaining-tokens"] for r in answers] == ["596", "592", "588", "588"]
    refused = answers[3]  # a's own budget refused it: a took nothing from the account
    assert (refused.body["error"]["type"], refused.headers["Retry-After"]) == ("requests", "30")
    stats = standin.stats()
    acme = stats["accounts"]["acme"]
    assert (acme["requests"], acme["served"], acme["refused"]["requests"], acme["over_quota"]) == (4, 3, 1, 0)
    assert (stats["a"]["served"], stats["a"]["rate_limited_requests"], stats["b"]["served"]) == (2, 1, 1)


def test_the_stats_show_each_account_and_its_callers_and_a_reset_zeroes_them() -> None:
    clock = HandClock()
    standin = service(clock, {"concurrency": 2, "requests_per_minute": 60}, b={"latency_s": 0.0})
    admit(standin, "a", "alice")  # held from t=0
    assert standin.call("b", None, BODY, "bob").status == 200
    clock.now = 2.0
    stats = standin.stats()
    assert set(stats) == {"a", "b", "service", "accounts", "batches"}
    flight = {"in_flight": 0, "max_in_flight": 1, "busy_s": 0.0}
    assert stats["accounts"] == {"acme": {
        "config": {"name": "acme", "concurrency": 2, "requests_per_minute": 60, "tokens_per_minute": None,
                   "tokens": "total"},
        "endpoints": ["a", "b"],
        "requests": 2, "served": 1, "tokens_input": 1, "tokens_output": 3, "refused": NO_REFUSALS,
        "over_quota": 0, "in_flight": 1, "max_in_flight": 2, "busy_s": 2.0,
        "callers": {
            "alice": {"requests": 1, "served": 0, "tokens_input": 0, "tokens_output": 0,
                      "refused": NO_REFUSALS, **flight, "in_flight": 1, "busy_s": 2.0},
            "bob": {"requests": 1, "served": 1, "tokens_input": 1, "tokens_output": 3, "refused": NO_REFUSALS,
                    **flight}}}}
    assert stats["a"]["config"]["account"] == "acme"
    text = generate_latest(standin.registry).decode()
    for line in ('ai_service_caller_served_total{account="acme",caller="bob"} 1.0',
                 'ai_service_caller_requests_total{account="acme",caller="alice"} 1.0',
                 'ai_service_caller_busy_seconds_total{account="acme",caller="alice"} 2.0',
                 'ai_service_caller_in_flight{account="acme",caller="alice"} 1.0',
                 'ai_service_caller_refused_total{account="acme",caller="bob",kind="concurrency"} 0.0',
                 'ai_service_caller_tokens_total{account="acme",caller="bob",kind="output"} 3.0',
                 'ai_service_account_over_quota_total{account="acme"} 0.0',
                 'ai_service_account_max_in_flight{account="acme"} 2.0',
                 'ai_service_account_limit{account="acme"} 2.0'):
        assert line in text, line

    standin.reset()  # at t=2: alice's call stays in flight
    clock.now = 3.0
    acme = standin.stats()["accounts"]["acme"]
    zero = {"requests": 0, "served": 0, "tokens_input": 0, "tokens_output": 0, "refused": NO_REFUSALS}
    assert {k: acme[k] for k in (*zero, "over_quota", "in_flight", "max_in_flight", "busy_s")} == \
        {**zero, "over_quota": 0, "in_flight": 1, "max_in_flight": 1, "busy_s": 1.0}
    assert acme["callers"] == {"alice": {**zero, "in_flight": 1, "max_in_flight": 1, "busy_s": 1.0},
                               "bob": {**zero, "in_flight": 0, "max_in_flight": 0, "busy_s": 0.0}}
    assert standin.accounts["acme"].headers(1.0)["x-ratelimit-remaining-requests"] == "60"  # full again


def test_an_account_s_limits_change_at_run_time_and_a_changed_budget_starts_full() -> None:
    clock = HandClock()
    standin = service(clock, {"concurrency": 1, "requests_per_minute": 3})
    account = standin.accounts["acme"]
    assert isinstance(admit(standin, "a")[0], EndpointConfig)
    assert admit(standin, "b")[0] == Refusal("rejected_429", 1.0)
    standin.update({"accounts": {"acme": {"concurrency": 2}}})  # the budget is unchanged: 2 left
    assert isinstance(admit(standin, "b")[0], EndpointConfig)
    assert account.headers(1.0)["x-ratelimit-remaining-requests"] == "1"
    standin.update({"accounts": {"acme": {"requests_per_minute": 4}}, "limit": 5})
    assert account.headers(1.0)["x-ratelimit-remaining-requests"] == "4"  # a new budget, full
    for bad in ({"accounts": {"other": {"concurrency": 1}}}, {"accounts": {"acme": {"name": "x"}}},
                {"accounts": {"acme": {"concurrency": 0}}}, {"accounts": {"acme": {"tokens": "both"}}},
                {"accounts": {"acme": {"requests_per_minute": 1.5}}}, {"accounts": {"acme": 3}},
                {"accounts": ["acme"]}, {"accounts": {"acme": {"concurrency": 9}}, "a": {"limit": -1}},
                {"a": {"account": None}}):
        with pytest.raises(ConfigError):
            standin.update(bad)
    stats = standin.stats()
    assert stats["accounts"]["acme"]["config"] == {"name": "acme", "concurrency": 2, "requests_per_minute": 4,
                                                   "tokens_per_minute": None, "tokens": "total"}
    assert (stats["a"]["config"]["limit"], stats["a"]["config"]["account"]) == (5, "acme")


def test_a_config_naming_an_unknown_account_or_a_bad_one_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"endpoint 'b' names account 'acme', which is not one of the "
                                          r"accounts \['other'\]"):
        ServiceConfig({"b": B}, accounts={"other": AccountConfig(name="other")})
    with pytest.raises(ConfigError, match="another name than their own"):
        ServiceConfig({"a": A}, accounts={"acme": AccountConfig(name="acne")})
    with pytest.raises(ConfigError, match="reserved"):
        ServiceConfig({"accounts": replace(A, account=None)})
    for bad, message in (({"name": ""}, "name"), ({"concurrency": 0}, "concurrency"),
                         ({"tokens_per_minute": 1.5}, "tokens_per_minute"), ({"tokens": "both"}, "tokens")):
        with pytest.raises(ConfigError, match=message):
            AccountConfig(**{"name": "acme", **bad})
    with pytest.raises(ConfigError, match="account must be a non-empty string"):
        replace(A, account="")


def test_specs_naming_a_quota_build_one_account_for_their_endpoints() -> None:
    tickets = load("support_tickets")  # three chat models on one path
    spec = tickets.model_copy(update={"endpoints": {name: e.model_copy(update={"quota": "team"})
                                                    for name, e in tickets.endpoints.items()}})
    team = SimpleNamespace(name="team", description="one key for both models", concurrency=4,
                           requests_per_minute=600, tokens_per_minute=None, tokens="output")
    unused = SimpleNamespace(name="unused", description="", concurrency=1, requests_per_minute=None,
                             tokens_per_minute=None, tokens="total")
    config = ServiceConfig.from_specs([spec], quotas={"team": team, "unused": unused})
    assert config.accounts == {"team": AccountConfig(name="team", concurrency=4, requests_per_minute=600,
                                                     tokens="output")}
    assert {name: c.account for name, c in config.endpoints.items()} == {
        "small_model": "team", "large_model": "team", "large_model_next": "team"}
    with pytest.raises(SpecError, match=r"team"):  # no quota file of that name
        ServiceConfig.from_specs([spec])
    assert ServiceConfig.from_specs([tickets], quotas={"team": team}).accounts == {}


def test_over_http_the_account_bounds_both_endpoints_and_counts_each_x_caller() -> None:
    config = ServiceConfig({"a": A, "b": B}, accounts={"acme": AccountConfig(name="acme", concurrency=3)})
    server = serve(config, host="127.0.0.1", port=0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    barrier = threading.Barrier(8)

    def post(i: int) -> requests.Response:
        barrier.wait()
        return requests.post(f"{base}/v1/{'ab'[i % 2]}", json={"request_id": f"r-{i}"},
                             headers={"X-Caller": "alice" if i < 4 else "bob"}, timeout=10)

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(post, range(8)))  # 8 at once across both, 1 s each
        assert sorted(r.status_code for r in answers) == [200] * 3 + [429] * 5
        refused = next(r for r in answers if r.status_code == 429)
        assert (refused.json()["error"]["type"], refused.headers["Retry-After"]) == ("concurrency", "1")
        assert requests.post(f"{base}/v1/a", json={"request_id": "r-9"}, timeout=5).status_code == 200
        acme = requests.get(f"{base}/v1/stats", timeout=5).json()["accounts"]["acme"]
        assert (acme["served"], acme["over_quota"], acme["max_in_flight"], acme["in_flight"]) == (4, 5, 3, 0)
        callers = acme["callers"]
        assert {name: c["requests"] for name, c in callers.items()} == {"-": 1, "alice": 4, "bob": 4}
        assert (callers["alice"]["served"] + callers["bob"]["served"], callers["-"]["served"]) == (3, 1)
        assert callers["alice"]["refused"]["concurrency"] + callers["bob"]["refused"]["concurrency"] == 5
        assert 4.0 <= acme["busy_s"] < 6.0  # four calls of a second each
        text = requests.get(f"{base}/metrics", timeout=5).text
        assert 'ai_service_caller_requests_total{account="acme",caller="alice"} 4.0' in text
        assert 'ai_service_account_over_quota_total{account="acme"} 5.0' in text
    finally:
        server.shutdown()
        server.server_close()
