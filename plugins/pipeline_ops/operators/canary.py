"""A canary's tasks: open it beside the live deployment, run a step, decide, promote or roll back.

`pipeline_canary` chains them: open -> step 1 -> decide 1 -> (step 2 | review 1 | promote |
rollback) ... Each step task lends its share, waits for the candidate to hold it, measures one
window and judges it (`pipeline_ops.canary`); it reports a candidate that failed the step as a
result, not as an error, so the decision stays the DAG's. A step past the plan's analysis steps
has nothing to measure and lets its decision promote.
"""

from __future__ import annotations

import json
from contextlib import closing
from typing import Any

from airflow.providers.standard.operators.branch import BaseBranchOperator
from airflow.sdk import BaseOperator

from consumers.config.canary_plan import CanaryPlan, canary_refusals, changed_stages
from consumers.runs.canary_samples import ACTIVE, CANDIDATE
from measure.canary import MARGINAL, PASS, CanaryThresholds
from pipeline_ops.canary import (
    DONE,
    Canary,
    CanaryRecords,
    CanarySteps,
    promote,
    roll_back,
    run_step,
)
from pipeline_ops.connections import database_url, kafka_access
from pipeline_ops.fleets.supervisord import FleetSupervisor, canary_deployment
from pipeline_ops.operators.candidate import resolve
from pipeline_ops.operators.runs import Connections
from pipeline_ops.registry import ConfigRegistry


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
                       "extensions", "thresholds")

    def __init__(self, *, pipeline: str, run_id: str, candidate: str, overrides: Any, steps: Any,
                 window_s: Any, extensions: Any, thresholds: Any, approval_timeout_s: float,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline, self.run_id, self.candidate, self.overrides = pipeline, run_id, candidate, overrides
        self.steps, self.window_s, self.extensions, self.thresholds = steps, window_s, extensions, thresholds
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
        plan = CanaryPlan(tuple(float(s) for s in steps), float(self.window_s), self.approval_timeout_s,
                          int(self.extensions))
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
        with closing(self._steps(canary)) as steps:
            result = run_step(canary, steps, records, self.step)
        self.log.info("canary %d step %d: %s", canary.id, self.step, result.get("summary", result["reason"]))
        return result


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

        def stop_canary() -> None:
            fleets.stop(canary_deployment(canary.run_id, canary.id))

        with closing(self._steps(canary)) as steps:
            if self.action == "promote":
                registry = ConfigRegistry(self.conns.postgres)
                config = registry.get(canary.candidate_version).config
                # Only the stages the candidate configures differently restart: a program whose
                # command is unchanged is not restarted by supervisord, and nothing would come.
                changed = tuple(changed_stages(registry.get(canary.active_version).config, config))

                def restart_live() -> None:
                    registry.activate(canary.candidate_version, "canary", canary.run_id,
                                      reason=f"canary {canary.id}")
                    if changed:
                        fleets.scale(canary.run_id, canary.candidate_version, config,
                                     self.conns.environment(config), stages=changed)

                promote(canary, steps, records, restart_live, stop_canary,
                        f"every step passed ({context['run_id']})")
                return {"canary": canary.id, "state": "promoted"}
            reason = self.reason or ("its run ended without a decision" if self.action == "settle"
                                     else "judged")
            roll_back(canary, steps, records, stop_canary, reason)
        return {"canary": canary.id, "state": "rolled_back", "reason": reason}
