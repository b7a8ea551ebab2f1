"""The gate's decision on a candidate's trials, and what follows it: promotion, the report, and
rollback to an earlier version."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow.providers.standard.operators.branch import BaseBranchOperator
from airflow.sdk import BaseOperator

from consumers.config import events, pipeline_spec
from consumers.config.candidate import PipelineConfig
from consumers.config.pipeline_spec import PipelineSpec
from consumers.runs.run_figures import ATTEMPTS_SQL, WITHIN_OBJECTIVE_SQL, attempt_costs, objective_at
from measure import figures as measure
from pipeline_ops import gate, report
from pipeline_ops.registry import ConfigRegistry


def trial_figures(hook: PostgresHook, spec: PipelineSpec, run_id: str, produced: int,
                  ai_limit: int, time_scale: float) -> dict[str, Any]:
    """One trial's figures as the gate sees them: the Spark analysis of its run and the skew of
    its pipeline's measured topic, turned into figures by measure.figures, with the skew's
    diagnosis (measure.skew) for the report and the gate page, its cost from its attempt rows
    (measure.cost), and, when the spec declares a latency objective, its goodput from its
    request rows (measure.figures.objective_figures, at the run's `time_scale`)."""
    analysis = hook.get_first("SELECT figures FROM analysis_pipeline WHERE run_id = %s",
                              parameters=(run_id,))
    skew = hook.get_first("SELECT max_over_mean, cv, records, partitions, diagnosis, recommendation "
                          "FROM analysis_skew WHERE topic = %s ORDER BY computed_at DESC LIMIT 1",
                          parameters=(events.Topics(run_id, spec).name(spec.load.measure),))
    if analysis is None or skew is None:
        raise RuntimeError(f"no Spark analysis for run {run_id}: the analysis tasks did not write it")
    figures = measure.from_analysis(
        analysis[0], produced=produced, ai_limit=ai_limit, skew_max_over_mean=skew[0], skew_cv=skew[1],
        skew_records=skew[2], skew_partitions=skew[3])
    attempts = hook.get_records(ATTEMPTS_SQL, parameters={"run": run_id})
    objective = objective_at(spec, time_scale)
    met = None if objective is None else measure.objective_figures(
        *objective, figures["completed"],
        hook.get_first(WITHIN_OBJECTIVE_SQL, parameters={"run": run_id, "objective": objective[0]})[0],
        figures["span_s"])
    return {"run_id": run_id, **figures, "skew_diagnosis": skew[4], "skew_recommendation": skew[5],
            "cost": attempt_costs(attempts, figures["completed"], spec), "objective": met}


class PromotionGateOperator(BaseBranchOperator):
    """Decide on the candidate's trials, record the decision with its figures, branch to
    promote/reject. The reference is the last passed measurement under the same conditions of
    the active version of the candidate's pipeline: for the active version itself (the nightly
    run) its own, and a failed re-measurement of the active version raises a regression alarm."""

    template_fields = ("candidate", "trials", "target_utilization", "min_throughput_rps", "tolerance",
                       "max_skew", "max_cost_per_request", "require_objective")

    def __init__(self, *, candidate: Any, trials: Any, target_utilization: float | str = 0.9,
                 min_throughput_rps: float | str = 0.0, tolerance: float | str = 0.1,
                 max_skew: float | str = 2.0, max_cost_per_request: float | str = 0.0,
                 require_objective: bool | str = False,
                 promote_task_id: str = "promote", reject_task_id: str = "reject",
                 postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.candidate, self.trials = candidate, trials
        self.target_utilization, self.min_throughput_rps = target_utilization, min_throughput_rps
        self.tolerance, self.max_skew = tolerance, max_skew
        self.max_cost_per_request, self.require_objective = max_cost_per_request, require_objective
        self.promote_task_id, self.reject_task_id = promote_task_id, reject_task_id
        self.postgres_conn_id = postgres_conn_id

    def choose_branch(self, context: Any) -> str:
        thresholds = gate.Thresholds(float(self.target_utilization), float(self.min_throughput_rps),
                                     float(self.tolerance), float(self.max_skew),
                                     max_cost_per_request=float(self.max_cost_per_request),
                                     require_objective=str(self.require_objective).lower() == "true")
        candidate, measured = _as_dict(self.candidate), _as_dict(self.trials)
        if not measured or not measured.get("trials"):
            raise RuntimeError("no trials to decide on: the trials task returned nothing")
        registry = ConfigRegistry(self.postgres_conn_id)
        # The spec as the candidate ran it: a stage switched to another endpoint is priced at its prices.
        spec = PipelineConfig.from_dict(candidate["config"]).spec
        trials = [trial_figures(registry.hook, spec, t["run_id"], t["produced"], measured["ai_limit"],
                                measured["conditions"]["time_scale"]) for t in measured["trials"]]
        active = registry.active(spec.name)
        reference = registry.reference(active.version, measured["conditions"]) if active else None
        decision = gate.evaluate(trials, thresholds, reference)
        figures = {"trials": trials, "summary": gate.summarise(trials, thresholds.confidence),
                   "conditions": measured["conditions"],
                   "reference": {"version": active.version, "steady_throughput_rps": reference}
                   if active and reference else None}
        decision_id = registry.record_decision(candidate["run_id"], candidate["version"],
                                               active.version if active else None, decision.passed,
                                               decision.reasons(), figures, asdict(thresholds))
        self.log.info("gate decision %d for version %d of %s: %s", decision_id, candidate["version"],
                      spec.name, decision.summary())
        alarm = None
        if active is not None and active.version == candidate["version"] and not decision.passed:
            alarm = registry.raise_alarm(active.version, decision_id, candidate["run_id"],
                                         [r for r in decision.reasons() if not r["passed"]])
            self.log.warning("regression alarm %d: the active version %d no longer passes the gate",
                             alarm, active.version)
        context["ti"].xcom_push(key="decision", value={
            "id": decision_id, "passed": decision.passed, "summary": decision.summary(),
            "reasons": decision.reasons(), "figures": figures, "alarm": alarm})
        return self.promote_task_id if decision.passed else self.reject_task_id


class _AfterGateOperator(BaseOperator):
    """A step after the gate: it reads the gate's decision and acts on the (templated) candidate."""

    template_fields = ("candidate",)

    def __init__(self, *, candidate: Any, postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.candidate, self.postgres_conn_id = candidate, postgres_conn_id


class PromoteOperator(_AfterGateOperator):
    """Make the candidate the active configuration of its pipeline; a no-op when it already is
    (the nightly re-measurement of the active version)."""

    def execute(self, context: Any) -> dict[str, Any]:
        candidate = _as_dict(self.candidate)
        decision = context["ti"].xcom_pull(task_ids="gate", key="decision")
        if not decision or not decision.get("passed"):
            raise RuntimeError("no passed gate decision for this run: promotion only follows the gate")
        previous = ConfigRegistry(self.postgres_conn_id).activate(
            candidate["version"], "promote", candidate["run_id"], decision["figures"])
        if previous == candidate["version"]:
            self.log.info("version %d is already active: nothing to promote", previous)
        else:
            self.log.info("version %d is the active configuration of %s (was %s)", candidate["version"],
                          candidate["pipeline"], previous)
        return {"active": candidate["version"], "previous": previous,
                "changed": previous != candidate["version"]}


class GateReportOperator(_AfterGateOperator):
    """The run's report: the gate decision, its checks, and plots of the run, saved as files."""

    def execute(self, context: Any) -> dict[str, Any]:
        candidate = _as_dict(self.candidate)
        decision = context["ti"].xcom_pull(task_ids="gate", key="decision")
        if decision is None:
            raise RuntimeError("no gate decision to report: the gate task did not run")
        hook = PostgresHook(postgres_conn_id=self.postgres_conn_id)
        out = report.write(hook, candidate, decision)
        self.log.info("%s\nreport and plots in %s", report.text(candidate, decision), out)
        return {"report_dir": str(out), "passed": decision["passed"]}


class RollbackOperator(BaseOperator):
    """Re-activate a version of a pipeline (0: the one active before its current version), with
    a reason."""

    template_fields = ("pipeline", "version", "reason")

    def __init__(self, *, version: int | str, reason: str, pipeline: str = pipeline_spec.REFERENCE,
                 postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.version, self.reason, self.pipeline = version, reason, pipeline
        self.postgres_conn_id = postgres_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        reason, version = str(self.reason or "").strip(), int(self.version or 0)
        if not reason:
            raise ValueError("a rollback needs a reason: it is kept in the promotion history")
        if version < 0:
            raise ValueError(f"version must be a registered version, or 0 for the previous one; "
                             f"got {version}")
        previous, now = ConfigRegistry(self.postgres_conn_id).rollback(self.pipeline, version or None, reason)
        self.log.info("rolled %s back from version %d to %d: %s", self.pipeline, previous, now, reason)
        return {"pipeline": self.pipeline, "active": now, "previous": previous, "reason": reason}


def _as_dict(value: Any) -> dict[str, Any]:
    """XCom values arrive as dicts, or as their JSON text when rendered through a template."""
    return json.loads(value) if isinstance(value, str) else value

