"""The cost figures (measure.cost) on attempt rows written out by hand, every figure worked out
in the comments."""

from __future__ import annotations

import pytest
import yaml

from consumers.config import pipeline_spec
from consumers.runs.run_figures import objective_at, prices_of
from measure import cost
from measure.cost import Attempt, Prices

# draft: 0.5 per 1,000 input tokens, 1.5 per 1,000 output tokens; classify declares no prices
# and is priced by the gateway's reported cost.
PRICES = {"draft": Prices(0.5, 1.5), "classify": None}

ROWS = [
    Attempt("r1", "draft", "ok", 200, 1000, 200),  # used: 1000/1000 x 0.5 + 200/1000 x 1.5 = 0.8
    Attempt("r2", "draft", "http_429", 429),  # refused: not billed
    Attempt("r2", "draft", "ok", 200, 2000, 400),  # used: 1.0 + 0.6 = 1.6
    Attempt("r3", "draft", "ok", 200, 600, 200),  # used: 0.3 + 0.3 = 0.6
    Attempt("r3", "draft", "ok", 200, 600, 200),  # served again: paid twice, 0.6
    Attempt("r4", "draft", "timeout", 200),  # cut off after a 2xx began: failed, estimated
    Attempt("r5", "draft", "ok", 200, 800, 0, resulted=False),  # answer refused: failed, 0.4
    Attempt("r6", "draft", "timeout", None),  # abandoned: the provider went on, billed; failed, estimated
    Attempt("r6", "draft", "connection_error", None),  # refused connection: not billed
    Attempt("r6", "draft", "http_5xx", 500),  # not billed
    Attempt("r6", "draft", "not_sent", None),  # not billed
    Attempt("r1", "classify", "ok", 200, 100, 5, reported_cost=0.01),  # used: 0.01 reported
    Attempt("r2", "classify", "bad_answer", 200),  # a 2xx not JSON, then served again: paid twice, estimated
    Attempt("r2", "classify", "ok", 200, 300, 15, reported_cost=0.03),  # used: 0.03 reported
    Attempt("r2", "classify", "skipped_done", None),  # a recorded result served: no call
]
# draft's ok tries cost 0.8, 1.6, 0.6, 0.6, 0.4: mean 4.0 / 5 = 0.8, the estimate of r4's and r6's timeouts;
# their tokens average (1000 + 2000 + 600 + 600 + 800) / 5 = 1000 in, (200 + 400 + 200 + 200) / 5
# = 200 out. classify's ok tries cost 0.01 and 0.03: mean 0.02 for its bad answer, with
# (100 + 300) / 2 = 200 tokens in and (5 + 15) / 2 = 10 out.


def test_a_runs_figures_count_used_duplicate_and_failed_calls() -> None:
    got = cost.run_costs(ROWS, 3, PRICES)
    # billed: draft r1, r2, r3, r3, r4, r5, r6 and classify r1, r2, r2; r6's refused connection,
    # 5xx and unsent try are not
    assert (got["billed_calls"], got["used"], got["paid_twice"], got["failed"]) == (10, 5, 2, 3)
    assert got["abandoned"] == 2  # r4's and r6's timeouts
    assert (got["reported"], got["declared"], got["estimated"], got["unknown"]) == (2, 5, 3, 0)
    # 0.8 + 1.6 + 0.6 + 0.6 + 0.8 + 0.4 + 0.8 (draft) + 0.01 + 0.02 + 0.03 (classify) = 5.66
    assert got["cost"] == pytest.approx(5.66)
    assert got["cost_per_request"] == pytest.approx(5.66 / 3)
    assert got["cost_per_1k_requests"] == pytest.approx(5660 / 3)
    assert got["failed_cost"] == pytest.approx(2.0)  # 0.8 (r4) + 0.4 (r5) + 0.8 (r6)
    assert got["paid_twice_cost"] == pytest.approx(0.62)  # r3's second draft 0.6, r2's bad answer 0.02
    # input: 1000 + 2000 + 600 + 600 + 1000 + 800 + 1000 + 100 + 200 + 300 = 7600 / 3
    # output: 200 + 400 + 200 + 200 + 200 + 0 + 200 + 5 + 10 + 15 = 1430 / 3
    assert got["tokens_input_per_request"] == pytest.approx(7600 / 3)
    assert got["tokens_output_per_request"] == pytest.approx(1430 / 3)
    assert got["gateway_over_declared"] is None  # no try has both a reported cost and prices
    assert "cost per 1,000 completed requests: 5.66 / 3 x 1000 = 1886.67" in got["reasoning"]


def test_a_pair_billed_again_after_an_abandoned_try_is_used_once_and_paid_twice_once() -> None:
    rows = [Attempt("a", "draft", "timeout", None), Attempt("a", "draft", "ok", 200, 2000, 0),
            Attempt("b", "draft", "started", None), Attempt("b", "draft", "timeout", None)]
    got = cost.run_costs(rows, 1, PRICES)
    # a: the ok try is used (1.0), the abandoned one before it paid twice (estimated at 1.0);
    # b: no result, its first billed try failed, the second paid twice
    assert (got["used"], got["paid_twice"], got["failed"], got["abandoned"]) == (1, 2, 1, 3)
    assert got["paid_twice_cost"] == pytest.approx(2.0)


def test_the_first_ok_try_of_a_pair_is_the_one_used_however_the_pairs_interleave() -> None:
    rows = [Attempt("a", "draft", "ok", 200, 2000, 0), Attempt("b", "draft", "ok", 200, 1000, 0),
            Attempt("a", "draft", "ok", 200, 4000, 0)]
    got = cost.run_costs(rows, 2, PRICES)
    assert (got["used"], got["paid_twice"]) == (2, 1)
    assert got["paid_twice_cost"] == pytest.approx(2.0)  # a's second: 4000 / 1000 x 0.5


def test_a_call_costs_what_the_gateway_reported_else_its_tokens_at_the_declared_prices() -> None:
    price = Prices(0.5, 1.5)
    assert cost.call_cost(Attempt("r", "s", "ok", 200, 1000, 1000, 0.7), price) == (0.7, cost.REPORTED)
    assert cost.call_cost(Attempt("r", "s", "ok", 200, 1000, 1000), price) == (2.0, cost.DECLARED)
    # a reported 0 is a gateway without the model's price: the declared prices take over
    assert cost.call_cost(Attempt("r", "s", "ok", 200, 1000, 1000, 0.0), price) == (2.0, cost.DECLARED)
    assert cost.call_cost(Attempt("r", "s", "ok", 200, 1000, 1000, 0.0), None) == (0.0, cost.REPORTED)
    assert cost.call_cost(Attempt("r", "s", "ok", 200, 1000, 1000), None) == (None, cost.UNKNOWN)
    assert cost.call_cost(Attempt("r", "s", "ok", 200), price) == (None, cost.UNKNOWN)


def test_which_tries_are_billed() -> None:
    billed = {(o, s) for o, s in [("ok", 200), ("bad_answer", 200), ("started", None), ("timeout", 200),
                                  ("timeout", None), ("connection_error", 206)]}
    free = {(o, s) for o, s in [("timeout", 500), ("connection_error", None), ("connection_error", 503),
                                ("http_429", 429), ("http_4xx", 400), ("http_5xx", 503), ("not_sent", None),
                                ("skipped_done", None)]}
    assert all(cost.billed(Attempt("r", "s", o, s)) for o, s in billed)
    assert not any(cost.billed(Attempt("r", "s", o, s)) for o, s in free)


def test_gateway_and_declared_prices_are_set_side_by_side() -> None:
    rows = [Attempt("a", "draft", "ok", 200, 1000, 0, reported_cost=0.505),  # declared: 0.5
            Attempt("b", "draft", "ok", 200, 0, 1000, reported_cost=1.515)]  # declared: 1.5
    got = cost.run_costs(rows, 2, PRICES)
    assert got["cost"] == pytest.approx(2.02)  # the reported costs
    assert got["gateway_over_declared"] == pytest.approx(1.01)  # 2.02 / 2.0


def test_without_prices_or_reported_cost_the_figures_are_unknown_not_zero() -> None:
    rows = [Attempt("a", "generate", "ok", 200), Attempt("a", "generate", "ok", 200),
            Attempt("b", "generate", "started", None)]
    got = cost.run_costs(rows, 1, {"generate": None})
    assert got["cost"] is got["cost_per_1k_requests"] is got["tokens_input_per_request"] is None
    assert got["failed_cost"] is got["paid_twice_cost"] is None
    assert got["unknown"] == 3
    assert cost.shown(got["cost_per_1k_requests"]) == "unknown"
    assert got["reasoning"][-1].startswith("unknown at generate:")
    # nothing failed and nothing was paid twice: those cost 0 whatever the prices
    alone = cost.run_costs(rows[:1], 1, {"generate": None})
    assert (alone["failed_cost"], alone["paid_twice_cost"]) == (0.0, 0.0)
    assert cost.shown(alone["cost"]) == "unknown"


def test_a_configuration_pools_its_runs() -> None:
    first = cost.run_costs(ROWS, 3, PRICES)  # 4.86 over 3 completed
    second = cost.run_costs([Attempt("r9", "draft", "ok", 200, 1000, 200)], 1, PRICES)  # 0.8 over 1
    got = cost.combined([first, second])
    assert (got["completed"], got["billed_calls"], got["paid_twice"]) == (4, 11, 2)
    assert got["cost_per_1k_requests"] == pytest.approx(1615.0)  # 6.46 / 4 x 1000
    assert got["failed_cost"] == pytest.approx(2.0)
    assert got["tokens_input_per_request"] == pytest.approx(2150.0)  # (7600 + 1000) / 4
    unknown = cost.run_costs([Attempt("x", "draft", "ok", 200)], 1, {"draft": None})
    assert cost.combined([first, unknown])["cost_per_1k_requests"] is None


def test_a_latency_objective_is_declared_with_its_share_and_scaled_with_the_run() -> None:
    document = yaml.safe_load(pipeline_spec.path_of("text_moderation").read_text())
    document["objective"] = {"latency_s": 30}
    spec = pipeline_spec.parse(document)
    assert objective_at(spec, 0.2) == (pytest.approx(6.0), 0.99)  # 30 s at a fifth of real time
    assert objective_at(pipeline_spec.load("text_moderation"), 0.2) is None
    for bad, field in (({"latency_s": 0}, "latency_s"), ({"latency_s": 5, "share": 1.5}, "share")):
        document["objective"] = bad
        with pytest.raises(pipeline_spec.SpecError, match=rf"objective\.{field}"):
            pipeline_spec.parse(document)


def test_an_endpoints_declared_prices_price_the_stages_that_call_it() -> None:
    document = yaml.safe_load(pipeline_spec.path_of("text_moderation").read_text())
    document["endpoints"]["summarize"]["price"] = {"input_per_1k": 0.00015, "output_per_1k": 0.0006}
    spec = pipeline_spec.parse(document)
    assert prices_of(spec) == {"moderate": None, "summarize": Prices(0.00015, 0.0006), "classify": None}
    document["endpoints"]["summarize"]["price"] = {"input_per_1k": -1, "output_per_1k": 0.0006}
    with pytest.raises(pipeline_spec.SpecError, match=r"endpoints\.summarize\.price\.input_per_1k"):
        pipeline_spec.parse(document)


def test_a_batch_try_is_priced_at_its_tier_and_a_late_batch_answer_is_paid_twice() -> None:
    realtime, batch = Prices(0.0025, 0.01), Prices(0.00125, 0.005)
    rows = [
        Attempt("t1", "draft", "ok", 200, 1000, 200),  # realtime: 0.0025 + 0.002 = 0.0045, used
        Attempt("t2", "draft", "ok", 200, 1000, 200, tier="batch"),  # batch: 0.00125 + 0.001 = 0.00225, used
        Attempt("t3", "draft", "ok", 200, 2000, 200),  # fell back, realtime: 0.005 + 0.002 = 0.007, used
        # its batch answered too late: 0.0025 + 0.001 = 0.0035, paid twice
        Attempt("t3", "draft", "ok", 200, 2000, 200, tier="batch"),
    ]
    got = cost.run_costs(rows, 3, {"draft": realtime}, {("draft", "batch"): batch})
    assert (got["realtime_calls"], got["batch_calls"], got["flex_calls"]) == (2, 2, 0)
    assert got["realtime_cost"] == pytest.approx(0.0115)  # 0.0045 + 0.007
    assert got["batch_cost"] == pytest.approx(0.00575)  # 0.00225 + 0.0035
    assert got["cost"] == pytest.approx(0.01725)
    assert (got["paid_twice"], got["paid_twice_cost"]) == (1, pytest.approx(0.0035))
    assert got["batch_cost_per_1k_requests"] == pytest.approx(1.916667)  # 0.00575 / 3 x 1000
    assert got["flex_cost"] == 0.0 and got["flex_cost_per_1k_requests"] == 0.0
    # a batch try whose tier declares no price is unknown, however its stage's realtime price reads
    assert cost.run_costs(rows[1:2], 1, {"draft": realtime})["cost"] is None
