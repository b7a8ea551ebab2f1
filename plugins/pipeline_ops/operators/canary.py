"""A canary's tasks: open it beside the live deployment, run a step, decide, promote or roll back.

`pipeline_canary` chains them: open -> step 1 -> decide 1 -> (step 2 | review 1 | promote |
rollback) ... Each step task lends its share, waits for the candidate to hold it, measures one
window and judges it (`pipeline_ops.canary`); it reports a candidate that failed the step as a
result, not as an error, so the decision stays the DAG's. A step past the plan's analysis steps
has nothing to measure and lets its decision promote.
"""

from __future__ import annotations

import json
import time
from typing import Any

from airflow.providers.standard.operators.branch import BaseBranchOperator
from airflow.sdk import BaseOperator

from consumers.config.canary_plan import CanaryPlan, canary_refusals, changed_stages
from consumers.runs.canary_samples import ACTIVE, CANDIDATE, Window
from measure.canary import CanaryThresholds
from pipeline_ops.canary import Canary, CanaryRecords, CanarySteps
from pipeline_ops.connections import database_url, kafka_access
from pipeline_ops.fleets.supervisord import FleetSupervisor, canary_deployment
from pipeline_ops.operators.candidate import resolve
from pipeline_ops.operators.runs import Connections
from pipeline_ops.registry import ConfigRegistry

PASS, MARGINAL, FAIL, DONE = "pass", "marginal", "fail", "done"


class CanaryRefused(ValueError):
    """A candidate that cannot canary on the live topics, with the fields at fault."""


def _document(value: Any) -> Any:
    """A form value rendered into a template (JSON text), or as it was passed."""
    return json.loads(value) if isinstance(value, str) else value


def thresholds_of(form: dict[str, Any]) -> CanaryThresholds:
    """The form's thresholds (values may come as text), each of its declared type."""
    defaults = CanaryThresholds()
    return CanaryThresholds(**{k: type(getattr(defaults, k))(v) for k, v in form.items()})


def _canary_id(canary: Any) -> int:
    """The canary's id from the open task's XCom (rendered as text or passed as a dict)."""
    data = json.loads(canary) if isinstance(canary, str) else canary
    return int(data["canary"])


class _CanaryTask(BaseOperator):
    """What every canary task reads: the canary's row, both sides' configurations, the cluster."""

    def __init__(self, *, kafka_config_id: str = "kafka_default", postgres_conn_id: str = "postgres_default",
                 fleet_conn_id: str = "fleet_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conns = Connections(kafka_config_id, postgres_conn_id, fleet_conn_id)

    def _supervisor(self) -> FleetSupervisor:
        fleets = self.conns.fleets()
        if not isinstance(fleets, FleetSupervisor):
            raise NotImplementedError("canaries run their fleets under supervisord; the Kubernetes "
                                      "backend has no canary fleets yet")
        return fleets

    def _steps(self, canary: Canary) -> CanarySteps:
        registry = ConfigRegistry(self.conns.postgres)
        configs = {ACTIVE: registry.get(canary.active_version).config,
                   CANDIDATE: registry.get(canary.candidate_version).config}
        return CanarySteps(canary, configs, kafka_access(self.conns.kafka).default,
                           database_url(self.conns.postgres))


class CanaryOpenOperator(_CanaryTask):
    """Resolve the candidate, refuse what cannot canary on shared topics (naming the fields),
    record the canary and start its fleets beside the live deployment `run_id`."""

    template_fields = ("pipeline", "run_id", "candidate", "overrides", "steps", "window_s",
                       "thresholds")

    def __init__(self, *, pipeline: str, run_id: str, candidate: str, overrides: Any, steps: Any,
                 window_s: Any, thresholds: Any, approval_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline, self.run_id, self.candidate, self.overrides = pipeline, run_id, candidate, overrides
        self.steps, self.window_s, self.thresholds = steps, window_s, thresholds
        self.approval_timeout_s = approval_timeout_s

    def execute(self, context: Any) -> dict[str, Any]:
        registry = ConfigRegistry(self.conns.postgres)
        active = registry.active(self.pipeline)
        if active is None:
            raise ValueError(f"{self.pipeline} has no active version to canary against: promote one first")
        fleets = self._supervisor()
        if not fleets.running(self.run_id):
            raise ValueError(f"no live deployment {self.run_id!r}: deploy the active version first")
        overrides = _document(self.overrides) or {}
        name, config = resolve(registry, self.pipeline, self.candidate, overrides, {}, self.log)
        refusals = canary_refusals(active.config, config)
        if refusals:
            raise CanaryRefused("this candidate cannot canary on the live topics (use pipeline_tuning): "
                                + "; ".join(f"{r.field}: {r.reason}" for r in refusals))
        stages = changed_stages(active.config, config) or list(config.spec.ai_stages)
        steps = _document(self.steps)
        plan = CanaryPlan(tuple(float(s) for s in steps), float(self.window_s), self.approval_timeout_s)
        thresholds = thresholds_of(_document(self.thresholds) or {})
        version = registry.register(name, config, note=f"canary candidate from {context['run_id']}")
        records = CanaryRecords(self.conns.postgres)
        canary = records.open(self.pipeline, self.run_id, active.version, version, stages, plan,
                              thresholds)
        fleets.start_canary(self.run_id, canary, version, config, self.conns.environment(config),
                            tuple(stages))
        self.log.info("canary %d of %s: version %d beside %d on %s, steps %s", canary, self.pipeline,
                      version, active.version, stages, plan.steps)
        return {"canary": canary, "version": version, "active": active.version, "stages": stages,
                "steps": list(plan.steps)}


class CanaryStepOperator(_CanaryTask):
    """Step `step` (from 1) of the canary: lend its share, measure a window, judge it."""

    template_fields = ("canary",)

    def __init__(self, *, canary: Any, step: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.canary, self.step = canary, step

    def execute(self, context: Any) -> dict[str, Any]:
        records = CanaryRecords(self.conns.postgres)
        canary = records.get(_canary_id(self.canary))
        analysed = canary.plan.steps[:-1]  # the last (share 1) is the promotion's hand-over
        if self.step > len(analysed):
            return {"step": self.step, "outcome": DONE, "reason": "no analysis step left"}
        share = analysed[self.step - 1]
        steps = self._steps(canary)
        try:
            lent = steps.lend(share)
            records.step_started(canary.id, self.step, share, sum(len(p) for p in lent.values()))
            if not steps.wait_held(lent):
                reason = "the candidate did not take the partitions lent to it"
                records.step_judged(canary.id, self.step, Window(time.time(), time.time(), {}), FAIL,
                                    {"reason": reason})
                return {"step": self.step, "share": share, "outcome": FAIL, "reason": reason}
            window, verdict, why = steps.measure(lent, canary.plan.window_s)
        finally:
            steps.close()
        figures = verdict.to_dict() if verdict is not None else {"reason": why}
        outcome = verdict.outcome if verdict is not None else FAIL
        records.step_judged(canary.id, self.step, window, outcome, figures)
        self.log.info("canary %d step %d (%.0f %%): %s", canary.id, self.step, 100 * share,
                      verdict.summary() if verdict is not None else why)
        return {"step": self.step, "share": share, "outcome": outcome, "reason": why}


class CanaryDecideOperator(BaseBranchOperator):
    """After step `step`: pass goes to the next step (or promote after the last), marginal to a
    person's review, fail to the rollback."""

    def __init__(self, *, step: int, last: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step, self.last = step, last

    def choose_branch(self, context: Any) -> str:
        result = context["ti"].xcom_pull(task_ids=f"step_{self.step}")
        outcome = result["outcome"]
        records = CanaryRecords()
        canary = _canary_id(context["ti"].xcom_pull(task_ids="open"))
        nxt = "promote" if outcome == DONE or self.step == self.last else f"step_{self.step + 1}"
        chosen = {PASS: nxt, DONE: "promote", MARGINAL: f"review_{self.step}"}.get(outcome, "rollback")
        if outcome != DONE:
            records.decided(canary, self.step, f"{chosen}: {outcome}")
        return chosen


class CanaryCloseOperator(_CanaryTask):
    """End the canary: `promote` (the candidate takes every partition, the live fleets restart at
    its configuration and take them back, the canary's fleets stop) or `rollback` (every
    partition back to the live fleets, the canary's fleets stop). `settle` rolls back a canary
    its run left undecided (a task failed) and does nothing to one already closed."""

    template_fields = ("canary", "reason")

    def __init__(self, *, canary: Any, action: str, reason: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if action not in ("promote", "rollback", "settle"):
            raise ValueError(f"unknown action {action!r}: promote, rollback or settle")
        self.canary, self.action, self.reason = canary, action, reason

    def execute(self, context: Any) -> dict[str, Any]:
        records = CanaryRecords(self.conns.postgres)
        canary = records.get(_canary_id(self.canary))
        if self.action == "settle" and records.state(canary.id) != "running":
            return {"canary": canary.id, "state": records.state(canary.id)}
        fleets = self._supervisor()
        steps = self._steps(canary)
        try:
            if self.action == "promote":
                return self._promote(canary, steps, fleets, records, context)
            if not steps.recall():
                raise TimeoutError(f"canary {canary.id}: the live fleets did not take every partition back")
        finally:
            steps.close()
        fleets.stop(canary_deployment(canary.run_id, canary.id))
        reason = self.reason or ("its run ended without a decision" if self.action == "settle" else "judged")
        records.close(canary.id, "rolled_back", reason)
        return {"canary": canary.id, "state": "rolled_back", "reason": reason}

    def _promote(self, canary: Canary, steps: CanarySteps, fleets: FleetSupervisor, records: CanaryRecords,
                 context: Any) -> dict[str, Any]:
        """The candidate holds every partition while the live fleets restart at its configuration
        (they hold back what is lent), then hands them back: nothing waits for a fleet to start."""
        lent = steps.lend(1.0)
        if not steps.wait_held(lent):
            raise TimeoutError(f"canary {canary.id}: the candidate did not take every partition")
        registry = ConfigRegistry(self.conns.postgres)
        config = registry.get(canary.candidate_version).config
        registry.activate(canary.candidate_version, "canary", canary.run_id, reason=f"canary {canary.id}")
        fleets.scale(canary.run_id, canary.candidate_version, config, self.conns.environment(config),
                     stages=canary.stages)
        if not steps.recall():
            raise TimeoutError(f"canary {canary.id}: the live fleets did not take every partition back")
        fleets.stop(canary_deployment(canary.run_id, canary.id))
        records.close(canary.id, "promoted", f"every step passed ({context['run_id']})")
        return {"canary": canary.id, "state": "promoted"}
