"""Each operator's handling of missing or bad inputs, the pipeline each one works on, and the gate
operator's decision flow, with the registry and the database replaced by in-memory fakes (no
services)."""

from __future__ import annotations

from typing import Any

import pytest

from consumers.config import pipeline_spec
from consumers.config.candidate import PipelineConfig
from pipeline_ops.operators.candidate import ResolveCandidateOperator
from pipeline_ops.operators.deploy import DeployFleetOperator
from pipeline_ops.operators.load import LoadTestOperator
from pipeline_ops.operators.promotion import (
    GateReportOperator,
    PromoteOperator,
    PromotionGateOperator,
    RollbackOperator,
)
from pipeline_ops.operators.runs import request_count
from pipeline_ops.operators.topics import ProvisionTopicsOperator
from pipeline_ops.operators.trials import TrialsOperator
from pipeline_ops.registry import Version


class Untouchable:
    """Any use fails: an operator must refuse bad input before it reaches a service."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the registry was used ({name}) although the input was bad")


class FakeHook:
    """Spark analysis rows by run: analysis_pipeline documents and analysis_skew rows; the
    attempt rows of a run (none unless given); and its requests within a latency objective (by
    run, with the objective asked for)."""

    def __init__(self, documents: dict[str, dict], skews: dict[str, tuple],
                 attempts: dict[str, list[tuple]] | None = None) -> None:
        self.documents, self.skews, self.attempts = documents, skews, attempts or {}
        self.topics: list[str] = []  # whose skew was read
        self.within: dict[str, int] = {}
        self.objectives: list[float] = []  # the objectives asked for

    def get_records(self, sql: str, parameters: dict) -> list[tuple]:
        assert "FROM ai_attempts" in sql
        return self.attempts.get(parameters["run"], [])

    def get_first(self, sql: str, parameters: Any) -> tuple | None:
        if "FROM requests" in sql:
            self.objectives.append(parameters["objective"])
            return (self.within.get(parameters["run"], 0),)
        if "analysis_pipeline" in sql:
            return (self.documents[parameters[0]],) if parameters[0] in self.documents else None
        self.topics.append(parameters[0])
        return self.skews.get(parameters[0].rsplit(".", 1)[0])


class FakeRegistry:
    def __init__(self, active: int | None = None, reference: list[float] | None = None,
                 hook: FakeHook | None = None) -> None:
        self.active_version, self.reference_rps, self.hook = active, reference, hook
        self.registered: list[tuple[str, PipelineConfig]] = []
        self.asked_active: list[str] = []
        self.decisions: list[dict] = []
        self.alarms: list[tuple] = []
        self.activations: list[tuple] = []
        self.rollbacks: list[tuple] = []

    def register(self, name: str, config: PipelineConfig, note: str = "") -> int:
        self.registered.append((name, config))
        return 7

    def active(self, pipeline: str) -> Version | None:
        self.asked_active.append(pipeline)
        return None if self.active_version is None else Version(self.active_version, "flow",
                                                                PipelineConfig(pipeline=pipeline), True)

    def reference(self, version: int, conditions: dict) -> list[float] | None:
        return self.reference_rps

    def record_decision(self, run_id: str, candidate: int, active_before: int | None, passed: bool,
                        reasons: list, figures: dict, thresholds: dict) -> int:
        self.decisions.append({"run_id": run_id, "passed": passed, "reasons": reasons, "figures": figures,
                               "thresholds": thresholds, "active_before": active_before})
        return len(self.decisions)

    def raise_alarm(self, version: int, decision_id: int, run_id: str, failed: list) -> int:
        self.alarms.append((version, decision_id, run_id, [f["name"] for f in failed]))
        return 99

    def activate(self, version: int, action: str, run_id: str | None = None, figures: dict | None = None,
                 reason: str = "") -> int | None:
        self.activations.append((version, action, run_id))
        previous, self.active_version = self.active_version, version
        return previous

    def rollback(self, pipeline: str, to_version: int | None = None, reason: str = "") -> tuple[int, int]:
        self.rollbacks.append((pipeline, to_version, reason))
        if to_version == 404:
            raise ValueError("no configuration version 404")
        return 5, to_version or 4


class FakeTaskInstance:
    def __init__(self, decision: dict | None = None) -> None:
        self.pushed: dict[str, Any] = {}
        self.decision = decision

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, task_ids: str, key: str) -> Any:
        return self.decision


def use(monkeypatch: pytest.MonkeyPatch, registry: Any) -> None:
    for module in ("candidate", "capacity", "check", "deploy", "load", "promotion", "trials"):
        monkeypatch.setattr(f"pipeline_ops.operators.{module}.ConfigRegistry", lambda *_args: registry)


CONTEXT = {"run_id": "manual__2026", "ts_nodash": "20260101T020000"}


# --- resolve -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("candidate", "overrides", "preset_params", "message"), [
    ("flow", '{"partitons": 3}', {}, "unknown configuration keys"),
    ("flow", "{not json", {}, "Expecting property name"),
    ("flow", {}, {"partitions": "many"}, "invalid literal"),
    ("greedy", {}, {}, "unknown preset 'greedy'"),
])
def test_resolve_refuses_bad_candidates_before_registering(monkeypatch: pytest.MonkeyPatch, candidate: str,
                                                           overrides: Any, preset_params: dict,
                                                           message: str) -> None:
    use(monkeypatch, Untouchable())
    op = ResolveCandidateOperator(task_id="resolve", candidate=candidate, overrides=overrides,
                                  preset_params=preset_params)
    with pytest.raises(ValueError, match=message):
        op.execute(CONTEXT)


def test_resolve_registers_a_preset_with_form_values(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = FakeRegistry()
    use(monkeypatch, registry)
    op = ResolveCandidateOperator(task_id="resolve", candidate="flow",
                                  overrides='{"key_strategy": "none"}',
                                  preset_params={"partitions": "12", "time_scale": "0.1"})
    got = op.execute(CONTEXT)
    assert (got["version"], got["name"], got["run_id"]) == (7, "flow", "tuning-20260101t020000-v7")
    (name, config), = registry.registered
    assert (name, config.partitions, config.time_scale, config.key_strategy) == ("flow", 12, 0.1, "none")
    assert got["pipeline"] == config.pipeline == pipeline_spec.REFERENCE
    assert PipelineConfig.from_dict(got["config"]) == config


def test_resolve_builds_the_preset_of_the_chosen_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = FakeRegistry()
    use(monkeypatch, registry)
    got = ResolveCandidateOperator(task_id="resolve", pipeline="text_moderation", candidate="flow",
                                   preset_params={"flow_members": "3"}).execute(CONTEXT)
    (_, config), = registry.registered
    assert got["pipeline"] == config.pipeline == "text_moderation"
    assert {s: config.stage(s).members for s in config.spec.ai_stages} == {
        "moderate": 3, "summarize": 3, "classify": 3}
    assert registry.asked_active == []  # a preset: no active version looked up


def test_resolve_measures_the_active_version_of_the_chosen_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = FakeRegistry(active=4)
    use(monkeypatch, registry)
    got = ResolveCandidateOperator(task_id="resolve", pipeline="text_moderation",
                                   candidate="active").execute(CONTEXT)
    assert registry.asked_active == ["text_moderation"]
    assert got["pipeline"] == registry.registered[0][1].pipeline == "text_moderation"


def test_resolve_refuses_overrides_that_change_the_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, Untouchable())
    op = ResolveCandidateOperator(task_id="resolve", candidate="flow", preset_params={},
                                  overrides='{"pipeline": "text_moderation"}')
    with pytest.raises(ValueError, match="choose the pipeline with the form's `pipeline` field"):
        op.execute(CONTEXT)


# --- provision, deploy, load, trials -------------------------------------------------------------

def test_provision_needs_partitions_or_rates_to_size_them() -> None:
    op = ProvisionTopicsOperator(task_id="p", prefix="run", partitions="", target_rps="")
    with pytest.raises(ValueError, match="give the partitions"):
        op.execute(CONTEXT)


def test_deploy_refuses_an_unknown_action() -> None:
    op = DeployFleetOperator(task_id="d", action="restart", run_id="run")
    with pytest.raises(ValueError, match="unknown action 'restart'"):
        op.execute(CONTEXT)


@pytest.mark.parametrize(("burst", "rate", "duration_s"), [("0", "0", "0"), ("", "", ""), ("0", "5", "0")])
def test_load_test_refuses_an_empty_load(monkeypatch: pytest.MonkeyPatch, burst: str, rate: str,
                                         duration_s: str) -> None:
    use(monkeypatch, Untouchable())
    op = LoadTestOperator(task_id="l", run_id="run", version="1", burst=burst, rate=rate,
                          duration_s=duration_s)
    with pytest.raises(ValueError, match="nothing to send"):
        op.execute(CONTEXT)


def test_request_count_from_a_burst_or_a_rate() -> None:
    assert request_count("320", "0", "0") == (320, None)
    assert request_count("0", "2.5", "10") == (25, 2.5)  # a rate wins over a burst


@pytest.mark.parametrize(("trials", "ai_limit", "burst", "message"), [
    ("1", "16", "320", "trials must be at least 2"),
    ("3", "0", "320", "ai_limit must be a positive"),
    ("3", "16", "0", "nothing to send"),
])
def test_trials_refuse_bad_settings_before_deploying(monkeypatch: pytest.MonkeyPatch, trials: str,
                                                     ai_limit: str, burst: str, message: str) -> None:
    use(monkeypatch, Untouchable())
    op = TrialsOperator(task_id="t", run_id="run", version="1", trials=trials, ai_limit=ai_limit,
                        burst=burst)
    with pytest.raises(ValueError, match=message):
        op.execute(CONTEXT)


# --- gate --------------------------------------------------------------------------------------

def analysis(steady: float) -> dict:
    """A Spark analysis document: 320 completed, generate calls of 0.16 s (capacity 100 rps at 16),
    each request one call a stage; on a 2 s plateau generate's calls keep steady / 100 of its 16
    slots busy (steady x 0.32 call-seconds)."""
    notified = {"count": 320, "mean": 0.4, "p50": 0.3, "p95": 0.5, "p99": 0.6}
    return {"status": {"completed": 320}, "span_s": 4.0, "steady_throughput_rps": steady,
            "service_s": {"check": 0.03, "generate": 0.16}, "duplicates": {"total": 0, "by_stage": {}},
            "ok_calls": {"check": 320, "generate": 320}, "steady_band": [1.0, 3.0],
            "band_work": {"generate": {"busy_s": steady * 0.32, "started": round(2 * steady), "before": 0,
                                       "first_s": 0.0}},
            "latency_s": {"end_to_end": {"notified": notified}, "stages": {}}}


def measured(steady: list[float]) -> tuple[dict, FakeHook]:
    runs = [f"tuning-x-v7-t{n}" for n in range(1, len(steady) + 1)]
    trials = {"run_ids": runs, "ai_limit": 16, "conditions": {"time_scale": 0.05, "ai_limit": 16},
              "trials": [{"run_id": r, "produced": 320} for r in runs]}
    hook = FakeHook({r: analysis(s) for r, s in zip(runs, steady, strict=True)},
                    {r: (1.1, 0.1, 320, 16, "balanced", "nothing to fix") for r in runs})
    return trials, hook


CANDIDATE = {"version": 7, "run_id": "tuning-x-v7", "pipeline": pipeline_spec.REFERENCE,
             "config": {"pipeline": pipeline_spec.REFERENCE}}


def gate_operator(trials: Any, **thresholds: Any) -> PromotionGateOperator:
    return PromotionGateOperator(task_id="gate", candidate=CANDIDATE, trials=trials, **thresholds)


@pytest.mark.parametrize(("thresholds", "message"), [
    ({"tolerance": "1.5"}, "tolerance"), ({"target_utilization": "90"}, "share of the AI capacity"),
    ({"max_skew": "abc"}, "could not convert"),
])
def test_gate_refuses_bad_thresholds_before_reading_anything(monkeypatch: pytest.MonkeyPatch,
                                                             thresholds: dict, message: str) -> None:
    use(monkeypatch, Untouchable())
    with pytest.raises(ValueError, match=message):
        gate_operator(measured([95.0, 96.0])[0], **thresholds).choose_branch({"ti": FakeTaskInstance()})


@pytest.mark.parametrize("trials", [None, {}, {"trials": []}])
def test_gate_refuses_to_decide_without_trials(monkeypatch: pytest.MonkeyPatch, trials: Any) -> None:
    use(monkeypatch, Untouchable())
    with pytest.raises(RuntimeError, match="no trials"):
        gate_operator(trials).choose_branch({"ti": FakeTaskInstance()})


def test_gate_refuses_a_trial_the_analysis_did_not_cover(monkeypatch: pytest.MonkeyPatch) -> None:
    trials, hook = measured([95.0, 96.0, 97.0])
    del hook.documents["tuning-x-v7-t2"]
    registry = FakeRegistry(hook=hook)
    use(monkeypatch, registry)
    with pytest.raises(RuntimeError, match="no Spark analysis for run tuning-x-v7-t2"):
        gate_operator(trials).choose_branch({"ti": FakeTaskInstance()})
    assert registry.decisions == []


def test_gate_promotes_good_trials_and_records_them(monkeypatch: pytest.MonkeyPatch) -> None:
    trials, hook = measured([95.0, 96.0, 97.0])  # utilization 0.95..0.97: bound 0.96 - 2.92 x 0.01 / sqrt(3)
    registry = FakeRegistry(hook=hook)
    use(monkeypatch, registry)
    ti = FakeTaskInstance()
    assert gate_operator(trials).choose_branch({"ti": ti}) == "promote"
    (decision,) = registry.decisions
    assert decision["passed"] and decision["active_before"] is None
    assert [t["utilization"] for t in decision["figures"]["trials"]] == [0.95, 0.96, 0.97]
    assert decision["figures"]["summary"]["utilization"]["low"] == pytest.approx(0.9431, abs=1e-4)
    assert decision["figures"]["conditions"] == {"time_scale": 0.05, "ai_limit": 16}
    assert decision["thresholds"]["target_utilization"] == 0.9
    assert ti.pushed["decision"]["passed"] and ti.pushed["decision"]["alarm"] is None
    assert registry.alarms == []
    assert registry.asked_active == [pipeline_spec.REFERENCE]  # compared within its own pipeline
    assert hook.topics == [f"tuning-x-v7-t{n}.style" for n in (1, 2, 3)]  # genai_image's load.measure


def test_the_gate_reads_the_skew_of_the_pipelines_measured_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    trials, hook = measured([95.0, 96.0, 97.0])
    registry = FakeRegistry(hook=hook)
    use(monkeypatch, registry)
    moderation = PromotionGateOperator(task_id="gate", trials=trials,
                                       candidate={**CANDIDATE, "pipeline": "text_moderation",
                                                  "config": {"pipeline": "text_moderation"}})
    moderation.choose_branch({"ti": FakeTaskInstance()})
    assert hook.topics == [f"tuning-x-v7-t{n}.texts" for n in (1, 2, 3)]  # text_moderation's load.measure
    assert registry.asked_active == ["text_moderation"]
    # each trial's skew diagnosis goes with its figures to the report and the gate page
    trials = registry.decisions[0]["figures"]["trials"]
    assert {(t["skew_diagnosis"], t["skew_recommendation"]) for t in trials} == {
        ("balanced", "nothing to fix")}


def test_the_gate_prices_each_trial_from_its_attempt_rows_and_checks_a_ceiling(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Each of 320 requests' generate call reported 0.002; trial 2 called one of them twice.
    trials, hook = measured([95.0, 96.0, 97.0])
    call = ("generate", "ok", 200, None, None, 0.002, True)
    hook.attempts = {r: [(f"q{i}", *call) for i in range(320)] for r in trials["run_ids"]}
    hook.attempts["tuning-x-v7-t2"].append(("q0", *call))
    registry = FakeRegistry(hook=hook)
    use(monkeypatch, registry)
    context = {"ti": FakeTaskInstance()}
    assert gate_operator(trials, max_cost_per_request="0.01").choose_branch(context) == "promote"
    figures = registry.decisions[0]["figures"]
    assert [t["cost"]["paid_twice_cost"] for t in figures["trials"]] == [0.0, 0.002, 0.0]
    # 961 calls x 0.002 = 1.922 over 960 completed requests
    assert figures["summary"]["cost"]["cost_per_1k_requests"] == pytest.approx(1.922 / 960 * 1000)
    assert gate_operator(trials, max_cost_per_request="0.001").choose_branch(context) == "reject"
    failed = [r["name"] for r in registry.decisions[1]["reasons"] if not r["passed"]]
    assert failed == ["max_cost_per_request"]


def test_the_gate_prices_a_switched_stage_at_the_endpoint_the_candidate_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # draft switched to large_model_next (0.00375 / 0.015 per 1,000 tokens): 100 prompt and 50
    # answer tokens cost 0.001125 a call, not large_model's 0.00075.
    trials, hook = measured([95.0, 96.0, 97.0])
    call = ("draft", "ok", 200, 100, 50, None, True)
    hook.attempts = {r: [(f"q{i}", *call) for i in range(320)] for r in trials["run_ids"]}
    registry = FakeRegistry(hook=hook)
    use(monkeypatch, registry)
    candidate = {**CANDIDATE, "pipeline": "support_tickets", "config": {
        "pipeline": "support_tickets", "draft": {"work": {"endpoint": "large_model_next"}}}}
    PromotionGateOperator(task_id="gate", candidate=candidate, trials=trials).choose_branch(
        {"ti": FakeTaskInstance()})
    (trial, *_) = registry.decisions[0]["figures"]["trials"]
    assert trial["cost"]["cost_per_request"] == pytest.approx(0.001125)


def test_the_gate_holds_support_tickets_to_its_latency_objective_when_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # support_tickets: 99 % within 30 s, at the trials' time scale 0.05: 1.5 s. 320 completed per
    # trial over a 4 s span; 318, 319 and 320 of them within it: shares 0.9938, 0.9969 and 1 (to
    # four places), goodput 79.5, 79.75 and 80 rps.
    trials, hook = measured([95.0, 96.0, 97.0])
    hook.within = dict(zip(trials["run_ids"], (318, 319, 320), strict=True))
    registry = FakeRegistry(hook=hook)
    use(monkeypatch, registry)
    candidate = {**CANDIDATE, "pipeline": "support_tickets", "config": {"pipeline": "support_tickets"}}
    PromotionGateOperator(task_id="gate", candidate=candidate, trials=trials,
                          require_objective="True").choose_branch({"ti": FakeTaskInstance()})
    assert hook.objectives == [pytest.approx(1.5)] * 3
    decision = registry.decisions[0]
    assert [t["objective"]["goodput_rps"] for t in decision["figures"]["trials"]] == [79.5, 79.75, 80.0]
    # mean 0.9969, sd 0.0031, se 0.0031 / sqrt 3 = 0.0017898; t(0.95, 2 df) 2.919986: low
    # 0.9969 - 0.0052262 = 0.991674 >= 0.99
    (held,) = [r for r in decision["reasons"] if r["name"] == "latency_objective"]
    assert (held["passed"], held["measured"]) == (True, 0.9917)


def test_gate_rejects_a_candidate_slower_than_the_active_version(monkeypatch: pytest.MonkeyPatch) -> None:
    trials, hook = measured([95.0, 96.0, 97.0])
    registry = FakeRegistry(active=3, reference=[120.0, 121.0, 122.0], hook=hook)
    use(monkeypatch, registry)
    assert gate_operator(trials).choose_branch({"ti": FakeTaskInstance()}) == "reject"
    failed = [r["name"] for r in registry.decisions[0]["reasons"] if not r["passed"]]
    assert failed == ["regression"]
    assert registry.alarms == []  # a candidate, not the active version: nothing regressed


def test_a_failed_re_measurement_of_the_active_version_raises_an_alarm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    trials, hook = measured([95.0, 96.0, 97.0])
    registry = FakeRegistry(active=7, reference=[120.0, 121.0, 122.0], hook=hook)
    use(monkeypatch, registry)
    ti = FakeTaskInstance()
    assert gate_operator(trials).choose_branch({"ti": ti}) == "reject"
    assert registry.alarms == [(7, 1, "tuning-x-v7", ["regression"])]
    assert ti.pushed["decision"]["alarm"] == 99


# --- promote, report, rollback -----------------------------------------------------------------

@pytest.mark.parametrize("decision", [None, {"passed": False, "figures": {}}])
def test_promote_only_follows_a_passed_gate(monkeypatch: pytest.MonkeyPatch, decision: dict | None) -> None:
    use(monkeypatch, Untouchable())
    op = PromoteOperator(task_id="promote", candidate=CANDIDATE)
    with pytest.raises(RuntimeError, match="no passed gate decision"):
        op.execute({"ti": FakeTaskInstance(decision)})


def test_promoting_the_active_version_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = FakeRegistry(active=7)
    use(monkeypatch, registry)
    op = PromoteOperator(task_id="promote", candidate=CANDIDATE)
    got = op.execute({"ti": FakeTaskInstance({"passed": True, "figures": {}})})
    assert got == {"active": 7, "previous": 7, "changed": False}


def test_report_needs_the_gate_decision() -> None:
    op = GateReportOperator(task_id="report", candidate=CANDIDATE)
    with pytest.raises(RuntimeError, match="no gate decision"):
        op.execute({"ti": FakeTaskInstance(None)})


@pytest.mark.parametrize(("version", "reason", "message"), [
    ("0", "", "needs a reason"), ("0", "   ", "needs a reason"), ("-2", "slow", "registered version"),
    ("two", "slow", "invalid literal"),
])
def test_rollback_refuses_bad_input(monkeypatch: pytest.MonkeyPatch, version: str, reason: str,
                                    message: str) -> None:
    use(monkeypatch, Untouchable())
    with pytest.raises(ValueError, match=message):
        RollbackOperator(task_id="rollback", version=version, reason=reason).execute(CONTEXT)


def test_rollback_passes_the_version_and_reason_on(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = FakeRegistry()
    use(monkeypatch, registry)
    previous = RollbackOperator(task_id="r", version="0", reason=" slow since Monday ").execute(CONTEXT)
    named = RollbackOperator(task_id="r", pipeline="text_moderation", version="3",
                             reason="known good").execute(CONTEXT)
    assert registry.rollbacks == [("genai_image", None, "slow since Monday"),
                                  ("text_moderation", 3, "known good")]
    assert (previous["active"], previous["previous"], named["active"]) == (4, 5, 3)
    with pytest.raises(ValueError, match="no configuration version 404"):
        RollbackOperator(task_id="r", version="404", reason="x").execute(CONTEXT)
