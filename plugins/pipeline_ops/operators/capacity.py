"""A configuration version's max sustainable rate, searched on a deployment of its own."""

from __future__ import annotations

import itertools
from dataclasses import asdict, replace
from typing import Any

from airflow.sdk import BaseOperator

from consumers.config import events
from consumers.runs import capacity_search
from consumers.runs.pipeline_run import Pipeline
from consumers.runs.run_figures import burst_figures
from pipeline_ops import report
from pipeline_ops.operators.runs import Connections, fit_stand_in, measured
from pipeline_ops.registry import ConfigRegistry


class CapacitySearchOperator(BaseOperator):
    """Search a version's max sustainable rate (consumers.runs.capacity_search) on a deployment of its own:
    a calibration burst measures the AI capacity, steady-rate steps bisect from just below it,
    and the result goes to the registry beside the configuration, with a plot of the lag and
    the p99 of every step in `results/<run id>/`."""

    template_fields = ("run_id", "version", "ai_limit", "burst", "step_s", "p99_objective_s",
                       "lag_growth", "precision", "max_steps")

    def __init__(self, *, run_id: str, version: int | str, ai_limit: int | str, burst: int | str,
                 step_s: float | str = 20.0, p99_objective_s: float | str = 10.0,
                 lag_growth: float | str = 0.05, precision: float | str = 0.03, max_steps: int | str = 8,
                 timeout_s: float = 900, kafka_config_id: str = "kafka_default",
                 postgres_conn_id: str = "postgres_default",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id, self.version, self.ai_limit, self.burst = run_id, version, ai_limit, burst
        self.step_s, self.p99_objective_s, self.lag_growth = step_s, p99_objective_s, lag_growth
        self.precision, self.max_steps, self.timeout_s = precision, max_steps, timeout_s
        self.conns = Connections(kafka_config_id, postgres_conn_id)

    def execute(self, context: Any) -> dict[str, Any]:
        limit, burst = int(self.ai_limit), int(self.burst)
        if limit < 1 or burst < 1:
            raise ValueError(f"ai_limit and burst must be positive, got {limit} and {burst}")
        objective = capacity_search.Objective(p99_s=float(self.p99_objective_s),
                                       lag_growth=float(self.lag_growth), step_s=float(self.step_s),
                                       precision=float(self.precision), max_steps=int(self.max_steps))
        registry = ConfigRegistry(self.conns.postgres)
        version = registry.get(int(self.version))
        config = version.config
        objective = replace(objective, p99_s=objective.p99_s * config.time_scale)  # given at real scale
        if fit_stand_in(config, limit):
            self.log.info("AI stand-in set to time scale %s, limit %s", config.time_scale, limit)
        numbers = itertools.count(1)
        with measured(self.conns, self.run_id, version) as env:
            pipeline = Pipeline(self.run_id, events.Topics(self.run_id, config.spec), config, env.kafka,
                                env.database_url)

            def step(rate: float) -> capacity_search.Step:
                run_id = f"{self.run_id}-s{next(numbers)}"
                result = capacity_search.run_step(pipeline, run_id, rate, objective, limit, self.timeout_s)
                self.log.info("step at %.2f rps: %s", rate, result.summary())
                return result

            calibration = burst_figures(pipeline, f"{self.run_id}-calibrate", burst, limit, self.timeout_s)
            if not calibration["capacity_rps"]:
                raise RuntimeError("the calibration burst measured no AI capacity: no call succeeded")
            self.log.info("calibration: AI capacity %.2f rps", calibration["capacity_rps"])
            best, steps = capacity_search.search(step, 0.9 * calibration["capacity_rps"], objective)
        result = {"version": version.version, "name": version.name, "pipeline": config.pipeline,
                  "run_id": self.run_id,
                  "max_sustainable_rps": best, "ai_capacity_rps": calibration["capacity_rps"],
                  "share_of_capacity": round(best / calibration["capacity_rps"], 4) if best else None,
                  "objective": asdict(objective), "steps": [s.summary() for s in steps]}
        result["id"] = registry.record_capacity(version.version, self.run_id, best,
                                                calibration["capacity_rps"], result["objective"],
                                                result["steps"])
        out = report.write_capacity(result, steps)
        self.log.info("%s\nresults in %s", report.capacity_text(result), out)
        return result
