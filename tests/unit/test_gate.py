"""The promotion gate's decision (pipeline_ops.gate.evaluate): every check, at its boundaries; and
the gate page's decisions, each shown with its pipeline and filtered by it (no services)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from measure import cost
from measure.cost import Attempt, Prices
from pipeline_ops import ui
from pipeline_ops.gate import Thresholds, evaluate, summarise


def trial(utilization: float | None = 0.95, steady: float | None = 100.0, lost: int = 0,
          duplicates: int = 0, skew: float | None = 1.2) -> dict[str, Any]:
    return {"utilization": utilization, "steady_throughput_rps": steady, "throughput_rps": steady,
            "capacity_rps": 105.0, "lost": lost, "duplicate_ai_calls": duplicates,
            "skew_max_over_mean": skew}


def checks(decision) -> dict[str, Any]:
    return {c.name: c for c in decision.checks}


def test_good_trials_pass_every_check() -> None:
    decision = evaluate([trial(), trial(), trial()], Thresholds(), None)
    assert decision.passed
    assert [c.name for c in decision.checks] == ["utilization", "regression", "lost_requests",
                                                 "duplicate_ai_calls", "partition_skew"]
    assert decision.summary().startswith("PASSED: utilization 0.95 (>= 0.9 of the AI capacity")


def test_utilization_decides_on_the_lower_bound_not_the_mean() -> None:
    # mean 0.95, lower bound 0.95 - 2.919986 x 0.02 / sqrt(3) = 0.916283
    trials = [trial(0.93), trial(0.95), trial(0.97)]
    passing = checks(evaluate(trials, Thresholds(target_utilization=0.9162), None))["utilization"]
    assert (passing.passed, passing.measured) == (True, 0.9163)
    assert passing.interval["estimate"] == 0.95 and passing.interval["low"] == 0.9163
    failing = evaluate(trials, Thresholds(target_utilization=0.9163), None)
    assert not failing.passed and checks(failing)["utilization"].measured == 0.9163
    # a mean well above the target with a wide spread fails: 0.98 +- 0.08 -> bound 0.845
    assert not checks(evaluate([trial(0.9), trial(0.98), trial(1.06)], Thresholds(), None))[
        "utilization"].passed


def test_utilization_at_exactly_the_target_passes() -> None:
    decision = evaluate([trial(0.9)] * 3, Thresholds(target_utilization=0.9), None)
    assert checks(decision)["utilization"].passed
    assert not checks(evaluate([trial(0.9)] * 3, Thresholds(target_utilization=0.9001), None))[
        "utilization"].passed


def test_a_trial_without_a_capacity_fails_utilization() -> None:
    check = checks(evaluate([trial(), trial(None)], Thresholds(), None))["utilization"]
    assert (check.passed, check.measured) == (False, None)
    assert "not measured" in check.required


def test_throughput_floor_is_checked_only_when_set() -> None:
    assert "throughput_floor" not in checks(evaluate([trial()] * 2, Thresholds(), None))
    at_floor = checks(evaluate([trial(steady=100.0)] * 2, Thresholds(min_throughput_rps=100.0), None))
    assert at_floor["throughput_floor"].passed
    above = checks(evaluate([trial(steady=100.0)] * 2, Thresholds(min_throughput_rps=100.01), None))
    assert not above["throughput_floor"].passed


def test_regression_without_a_reference_passes_and_says_why() -> None:
    check = checks(evaluate([trial()] * 2, Thresholds(), None))["regression"]
    assert (check.passed, check.measured, check.interval) == (True, None, None)
    assert check.required == "no earlier measurement under the same conditions"


def test_regression_uses_the_lower_bound_of_the_difference() -> None:
    # candidate 10, 11, 12 against 12, 13, 14: difference -2, Welch df 4, bound -3.740646
    trials = [trial(steady=s) for s in (10.0, 11.0, 12.0)]
    strict = checks(evaluate(trials, Thresholds(tolerance=0.1), [12.0, 13.0, 14.0]))["regression"]
    assert (strict.passed, strict.measured) == (False, -3.741)  # floor -0.1 x 13 = -1.3
    assert strict.required.startswith(">= -1.30 rps difference: within 10% of the reference's 13.00 rps")
    assert strict.interval["estimate"] == -2.0 and strict.interval["df"] == 4.0
    loose = checks(evaluate(trials, Thresholds(tolerance=0.3), [12.0, 13.0, 14.0]))["regression"]
    assert loose.passed  # floor -3.9


def test_regression_at_exactly_the_tolerance_passes() -> None:
    reference = [100.0, 100.0, 100.0]
    at = evaluate([trial(steady=75.0)] * 3, Thresholds(tolerance=0.25), reference)
    assert checks(at)["regression"].passed and at.passed
    below = evaluate([trial(steady=74.99)] * 3, Thresholds(tolerance=0.25), reference)
    assert not checks(below)["regression"].passed and not below.passed


def test_regression_fails_when_a_trial_has_no_throughput() -> None:
    check = checks(evaluate([trial(), trial(steady=None)], Thresholds(), [100.0, 100.0]))["regression"]
    assert (check.passed, check.measured) == (False, None)


def test_lost_and_duplicates_are_summed_over_trials() -> None:
    decision = evaluate([trial(lost=1), trial(duplicates=2), trial(duplicates=1)], Thresholds(), None)
    got = checks(decision)
    assert (got["lost_requests"].passed, got["lost_requests"].measured) == (False, 1)
    assert (got["duplicate_ai_calls"].passed, got["duplicate_ai_calls"].measured) == (False, 3)
    assert decision.summary() == ("REJECTED: lost_requests 1 (== 0 over all trials); "
                                  "duplicate_ai_calls 3 (== 0 over all trials)")


def test_skew_takes_the_worst_trial_and_its_bound_is_inclusive() -> None:
    at_bound = checks(evaluate([trial(skew=1.1), trial(skew=2.0)], Thresholds(max_skew=2.0), None))
    assert (at_bound["partition_skew"].passed, at_bound["partition_skew"].measured) == (True, 2.0)
    over = checks(evaluate([trial(skew=1.1), trial(skew=2.001)], Thresholds(max_skew=2.0), None))
    assert not over["partition_skew"].passed
    unmeasured = checks(evaluate([trial(), trial(skew=None)], Thresholds(), None))
    assert not unmeasured["partition_skew"].passed  # a topic without records is no evidence


def test_skew_within_what_hashing_a_small_sample_explains_passes() -> None:
    # 160 requests over 16 partitions: hashing alone reaches 2.5 with probability 0.001; 2.1 is chance.
    small = {**trial(skew=2.1), "skew_hashing_bound": 2.5}
    passed = checks(evaluate([trial(), small], Thresholds(max_skew=2.0), None))["partition_skew"]
    assert (passed.passed, passed.measured) == (True, 2.1) and "2.5" in passed.required
    # The same skew over 100,000 requests (bound 1.11) is a partitioner's doing: max_skew applies.
    large = {**trial(skew=2.1), "skew_hashing_bound": 1.11}
    assert not checks(evaluate([trial(), large], Thresholds(max_skew=2.0), None))["partition_skew"].passed


def test_the_gate_needs_two_trials_on_each_side() -> None:
    with pytest.raises(ValueError, match="at least 2 trials"):
        evaluate([trial()], Thresholds(), None)
    with pytest.raises(ValueError, match="reference needs at least 2"):
        evaluate([trial(), trial()], Thresholds(), [100.0])


@pytest.mark.parametrize(("field", "value", "message"), [
    ("target_utilization", 1.2, "share of the AI capacity"), ("target_utilization", -0.1, "share"),
    ("min_throughput_rps", -1.0, "negative"), ("tolerance", 1.0, r"\[0, 1\)"),
    ("max_skew", 0.9, "at least 1"), ("confidence", 0.4, "confidence"), ("confidence", 1.0, "confidence"),
    ("max_cost_per_request", -0.01, "negative"),
])
def test_thresholds_refuse_values_that_mean_nothing(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Thresholds(**{field: value})


def costing(per_request: float | None) -> dict[str, Any]:
    """A trial whose calls cost `per_request` per completed request (None: unknown)."""
    return {**trial(), "cost": {"cost_per_request": per_request}}


def objective_trial(share: float | None, goodput: float) -> dict[str, Any]:
    return {**trial(), "objective": {"objective_s": 6.0, "objective_share": 0.99, "within_objective": 0,
                                     "share_within_objective": share, "goodput_rps": goodput}}


def test_the_latency_objective_is_checked_on_the_lower_bound_of_the_share_only_when_required() -> None:
    # shares 0.95, 0.97, 0.99: mean 0.97, sd 0.02, se 0.02 / sqrt 3 = 0.011547; t(0.95, 2 df)
    # = 2.919986, so the lower bound is 0.97 - 0.033717 = 0.936283, short of the 0.99 declared
    trials = [objective_trial(0.95, 9.0), objective_trial(0.97, 10.0), objective_trial(0.99, 11.0)]
    assert "latency_objective" not in checks(evaluate(trials, Thresholds(), None))
    held = checks(evaluate(trials, Thresholds(require_objective=True), None))["latency_objective"]
    assert (held.passed, held.measured) == (False, 0.9363)
    assert held.required == ">= 0.99 of requests within 6 s (95% lower bound over 3 trials)"
    close = [objective_trial(0.995, 10.0), objective_trial(0.996, 10.0), objective_trial(0.997, 10.0)]
    assert checks(evaluate(close, Thresholds(require_objective=True), None))["latency_objective"].passed
    # mean 0.996, sd 0.001: 0.996 - 2.919986 x 0.000577 = 0.994314 >= 0.99
    undeclared = checks(evaluate([trial(), trial()], Thresholds(require_objective=True), None))
    assert not undeclared["latency_objective"].passed
    assert "declares no latency objective" in undeclared["latency_objective"].required
    got = summarise(trials)
    assert got["objective"] == {"objective_s": 6.0, "objective_share": 0.99}
    assert (got["goodput_rps"]["estimate"], got["share_within_objective"]["low"]) == (10.0, 0.9363)
    assert summarise([trial(), trial()])["objective"] is None


def test_the_report_and_the_page_show_the_goodput_and_the_share_within_the_objective() -> None:
    from pipeline_ops import report

    trials = [{**objective_trial(share, goodput), "ai_limit": 8, "bottleneck_stage": "draft",
               "binding_limit": "draft.concurrency", "service_s": {"draft": 0.4}, "run_id": f"t{n}"}
              for n, (share, goodput) in enumerate(((0.95, 9.0), (0.97, 10.0), (0.99, 11.0)))]
    summary = summarise(trials)
    (line,) = [line for line in report.headline({"summary": summary, "trials": trials})
               if line.lstrip().startswith("objective")]
    # share 0.97 +- 0.033717 (above); goodput 10 +- 2.919986 x 1 / sqrt 3 = 1.685854
    assert line.split() == ["objective", "0.970", "[0.936,", "1.004]", "of", "requests", "within", "6", "s",
                            "end", "to", "end", "(declared:", "0.99),", "goodput", "10.0", "[8.3,", "11.7]",
                            "rps"]
    rows = [(1, "tuning-x-v1", 1, "flow", "support", None, True, [], {"summary": summary}, {},
             datetime(2026, 1, 1, tzinfo=UTC))]
    html = ui._templates.get_template("gate.html").render(
        decisions=ui.decisions(DecisionRows(rows)), actives=[], pipelines=["support"], pipeline=None,
        history=[], alarms=[], versions=[], capacity=[], latest=None, plots=[], results_dir="results",
        api_base="", rollback_dag="pipeline_rollback")
    (cell,) = re.findall(r'<span class="muted goodput">(.*?)</td>', html, re.S)
    assert " ".join(re.sub(r"<[^>]+>", " ", cell).split()) == (
        "goodput 10.00 [8.31, 11.69] , 0.970 [0.936, 1.004] of requests within 6.0 s (objective: 0.99)")


def test_the_cost_ceiling_is_checked_on_the_upper_bound_only_when_set() -> None:
    trials = [costing(0.001), costing(0.002), costing(0.003)]
    assert "max_cost_per_request" not in checks(evaluate(trials, Thresholds(), None))
    # mean 0.002, upper bound 0.002 + 2.919986 x 0.001 / sqrt(3) = 0.0036858545
    within = checks(evaluate(trials, Thresholds(max_cost_per_request=0.0037), None))["max_cost_per_request"]
    assert (within.passed, within.measured) == (True, 0.003685854)
    assert within.interval["estimate"] == 0.002
    assert within.required == "<= 0.0037 per completed request (95% upper bound over 3 trials)"
    over = evaluate(trials, Thresholds(max_cost_per_request=0.0036), None)
    assert not over.passed and checks(over)["max_cost_per_request"].measured == 0.003685854


def test_a_trial_whose_cost_is_unknown_fails_the_ceiling() -> None:
    for unknown in (costing(None), trial()):  # no price known; a trial from before costs were kept
        check = checks(evaluate([costing(0.001), unknown], Thresholds(max_cost_per_request=1.0), None))[
            "max_cost_per_request"]
        assert (check.passed, check.measured) == (False, None)
        assert "cost unknown in some trial" in check.required


# Two trials' attempt rows: 1,000 input and 200 output tokens at 0.5 and 1.5 per 1,000 cost 0.8 a call.
# The second served its request twice: 1.6 for its one completed request, 0.8 of it paid twice.
CALL = Attempt("r1", "draft", "ok", 200, 1000, 200)
RUNS = [cost.run_costs([CALL], 1, {"draft": Prices(0.5, 1.5)}),
        cost.run_costs([CALL, CALL], 1, {"draft": Prices(0.5, 1.5)})]


def test_summarise_pools_the_trials_cost() -> None:
    got = summarise([{**trial(), "cost": run} for run in RUNS])
    # (0.8 + 1.6) / 2 completed requests x 1000 = 1200; the per-request mean (0.8 + 1.6) / 2 = 1.2
    assert got["cost"]["cost_per_1k_requests"] == pytest.approx(1200.0)
    assert got["cost"]["paid_twice_cost"] == pytest.approx(0.8) and got["cost"]["failed_cost"] == 0.0
    assert got["cost_per_request"]["estimate"] == 1.2
    assert summarise([trial(), trial()])["cost"] is None  # trials from before costs were kept


def test_summarise_gives_intervals_totals_and_the_worst_skew() -> None:
    got = summarise([trial(0.93, lost=1, skew=1.5), trial(0.95, duplicates=2), trial(0.97)])
    assert got["trials"] == 3 and got["lost"] == 1 and got["duplicate_ai_calls"] == 2
    assert got["skew_max_over_mean"] == 1.5
    assert (got["utilization"]["estimate"], got["utilization"]["low"]) == (0.95, 0.9163)
    assert got["capacity_rps"]["low"] == got["capacity_rps"]["high"] == 105.0
    assert summarise([trial(None), trial()])["utilization"] is None


# --- the gate page -----------------------------------------------------------------------------

class DecisionRows:
    """gate_decisions joined with configurations, as the page's query returns them."""

    def __init__(self, rows: list[tuple]) -> None:
        self.rows, self.parameters = rows, None

    def get_records(self, sql: str, parameters: dict) -> list[tuple]:
        self.parameters = parameters
        return [r for r in self.rows if parameters["pipeline"] in (None, r[4])]


def decision_row(n: int, pipeline: str) -> tuple:
    reasons = [{"name": "utilization", "passed": True, "measured": 0.95, "required": ">= 0.9",
                "interval": None}]
    return (n, f"tuning-x-v{n}", n, "flow", pipeline, None, True, reasons, {"summary": {"trials": 3}}, {},
            datetime(2026, 1, n, tzinfo=UTC))


def test_decisions_carry_their_pipeline_and_filter_by_it() -> None:
    hook = DecisionRows([decision_row(1, "genai_image"), decision_row(2, "text_moderation")])
    assert [(d["version"], d["pipeline"]) for d in ui.decisions(hook)] == [(1, "genai_image"),
                                                                          (2, "text_moderation")]
    (only,) = ui.decisions(hook, pipeline="text_moderation")
    assert only["pipeline"] == "text_moderation" and hook.parameters["pipeline"] == "text_moderation"


def test_the_page_shows_each_decisions_pipeline_and_offers_a_filter() -> None:
    hook = DecisionRows([decision_row(1, "genai_image"), decision_row(2, "text_moderation")])
    actives = [{"version": 1, "name": "flow", "pipeline": "genai_image"},
               {"version": 2, "name": "flow", "pipeline": "text_moderation"}]
    versions = [{"version": 3, "name": "tuned", "pipeline": "text_moderation", "active": False}]
    html = ui._templates.get_template("gate.html").render(
        decisions=ui.decisions(hook), actives=actives, pipelines=["genai_image", "text_moderation"],
        pipeline=None, history=[], alarms=[], versions=versions, capacity=[], latest=None, plots=[],
        results_dir="results", api_base="", rollback_dag="pipeline_rollback")
    assert all(f'<td class="pipeline">{p}</td>' in html for p in ("genai_image", "text_moderation"))
    assert 'href="?pipeline=text_moderation"' in html  # the filter
    assert 'data-pipeline="text_moderation">text_moderation: <strong>v2 (flow)</strong>' in html
    assert 'value="text_moderation:0"' in html and 'value="text_moderation:3"' in html  # rollback targets


def test_the_page_and_the_report_show_the_cost_and_unknown_where_nothing_priced_it() -> None:
    from pipeline_ops import report

    priced = summarise([{**trial(), "cost": run} for run in RUNS])
    unpriced = summarise([{**trial(), "cost": cost.run_costs([CALL], 1, {"draft": None})}] * 2)
    rows = [(n, f"tuning-x-v{n}", n, "flow", "support", None, True, [], {"summary": summary}, {},
             datetime(2026, 1, n, tzinfo=UTC)) for n, summary in ((1, priced), (2, unpriced), (3, {}))]
    html = ui._templates.get_template("gate.html").render(
        decisions=ui.decisions(DecisionRows(rows)), actives=[], pipelines=["support"], pipeline=None,
        history=[], alarms=[], versions=[], capacity=[], latest=None, plots=[], results_dir="results",
        api_base="", rollback_dag="pipeline_rollback")
    cells = [c.split() for c in re.findall(r'<td class="num cost">(.*?)</td>', html, re.S)]
    assert [" ".join(c) for c in cells] == [
        '1200 <span class="muted">per 1,000 requests</span><br><span class="muted failed-cost">failed '
        'calls 0, paid twice 0.8 (tries: 1 paid twice, 0 abandoned)</span>',
        'unknown <span class="muted">per 1,000 requests</span><br><span class="muted failed-cost">failed '
        # nothing failed or was paid twice: 0 whatever the prices
        'calls 0, paid twice 0 (tries: 0 paid twice, 0 abandoned)</span>',
        "–"]  # a decision from before costs were kept

    trials = [{**trial(), "ai_limit": 8, "bottleneck_stage": "draft", "binding_limit": "draft.concurrency",
               "service_s": {"draft": 0.4}, "run_id": f"t{n}", "cost": run} for n, run in enumerate(RUNS)]
    lines = report.headline({"summary": summarise(trials), "trials": trials})
    (line,) = [line for line in lines if line.lstrip().startswith("cost")]
    # per request 0.8 and 1.6: mean 1.2 +- t(0.95, 1 df) 6.313752 x 0.4 (their standard error);
    # tokens (1000 + 2000) / 2 in, (200 + 400) / 2 out
    assert line.split() == ["cost", "1200", "per", "1,000", "completed", "requests,", "1.200000000",
                            "[-1.325500606,", "3.725500606]", "per", "request;", "failed", "calls", "0,",
                            "paid", "twice", "0.8", "(tries:", "1", "paid", "twice,", "0",
                            "abandoned);", "tokens", "per", "request", "1500", "in,", "300", "out"]


def test_a_cost_nothing_priced_says_which_endpoints_to_declare_prices_for_and_where() -> None:
    from consumers.config import pipeline_spec
    from pipeline_ops import report

    unpriced = cost.run_costs([Attempt("r1", "generate", "ok", 200, None, None)], 1, {})
    trials = [{**trial(), "ai_limit": 8, "bottleneck_stage": "generate",
               "binding_limit": "generate.concurrency", "service_s": {"generate": 3.0}, "run_id": f"t{n}",
               "cost": unpriced} for n in (1, 2)]
    figures = {"summary": summarise(trials), "trials": trials}
    # the reference pipeline declares no price for either of its endpoints
    (line,) = [line for line in report.headline(figures, pipeline_spec.load("genai_image"))
               if line.lstrip().startswith("cost")]
    assert "unknown: no gateway reported the calls' cost and endpoints check, generate declare no " \
           "price" in line
    assert line.endswith(f"under each in {pipeline_spec.PIPELINES_DIR / 'genai_image.yaml'} (docs/cost.md)")
    # without the spec, the figures as they are
    (bare,) = [line for line in report.headline(figures) if line.lstrip().startswith("cost")]
    assert bare.split()[:2] == ["cost", "unknown"] and "declare" not in bare


def test_the_binding_limit_is_named_in_the_summary_the_page_and_the_report() -> None:
    from pipeline_ops import report

    trials = [{**trial(), "binding_limit": "summarize.concurrency", "ai_limit": 64,
               "bottleneck_stage": "summarize", "service_s": {"summarize": 1.52}, "run_id": f"t{n}",
               "skew_max_over_mean": 1.2} for n in (1, 2)]
    trials.append({**trials[0], "binding_limit": "moderate.requests_per_minute", "run_id": "t3"})
    summary = summarise(trials)
    assert summary["binding_limits"] == ["moderate.requests_per_minute", "summarize.concurrency"]
    assert summarise([trial(), trial()])["binding_limits"] == []  # trials from before the binding limit

    row = (1, "tuning-x-v1", 1, "flow", "text_moderation", None, True, [], {"summary": summary}, {},
           datetime(2026, 1, 1, tzinfo=UTC))
    html = ui._templates.get_template("gate.html").render(
        decisions=ui.decisions(DecisionRows([row])), actives=[], pipelines=["text_moderation"], pipeline=None,
        history=[], alarms=[], versions=[], capacity=[], latest=None, plots=[], results_dir="results",
        api_base="", rollback_dag="pipeline_rollback")
    assert "bound by\n          moderate.requests_per_minute, summarize.concurrency" in html

    (capacity_line, *_) = report.headline({"summary": summary, "trials": trials})
    assert "binding limit moderate.requests_per_minute, summarize.concurrency" in capacity_line
    assert "64 concurrent calls, 1.52 s mean summarize call" in capacity_line
