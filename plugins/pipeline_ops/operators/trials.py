"""A configuration version measured several times, one trial after the other."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from pipeline_ops.operators.runs import Connections, drive_load, fit_stand_in, measured, request_count
from pipeline_ops.registry import ConfigRegistry


class TrialsOperator(BaseOperator):
    """Measure a configuration version `trials` times, one trial after the other: each gets
    fresh topics (`<run_id>-t<n>.*`), the version's fleets deployed (under supervisord, beside
    the AI stand-in), the load, and its fleets stopped again.

    A loop inside one task rather than mapped tasks: trials share the AI endpoints and the
    machine, so two must never overlap, which a loop guarantees and mapped task instances (run
    in parallel by the scheduler) would not. Their Spark analysis can run in parallel and
    follows in one job over every trial. Returns the trials' run ids and loads, the AI limit
    and the conditions (time scale, AI limit, load) that make two measurements comparable.
    """

    template_fields = ("run_id", "version", "trials", "burst", "rate", "duration_s", "ai_limit")

    def __init__(self, *, run_id: str, version: int | str, trials: int | str, ai_limit: int | str,
                 burst: int | str = 0, rate: float | str = 0, duration_s: float | str = 0,
                 timeout_s: float = 1800, kafka_config_id: str = "kafka_default",
                 postgres_conn_id: str = "postgres_default",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id, self.version, self.trials, self.ai_limit = run_id, version, trials, ai_limit
        self.burst, self.rate, self.duration_s, self.timeout_s = burst, rate, duration_s, timeout_s
        self.conns = Connections(kafka_config_id, postgres_conn_id)

    def execute(self, context: Any) -> dict[str, Any]:
        trials, limit = int(self.trials), int(self.ai_limit)
        if trials < 2:
            raise ValueError(f"trials must be at least 2 (the gate decides on confidence bounds), "
                             f"got {trials}")
        if limit < 1:
            raise ValueError(f"ai_limit must be a positive concurrency, got {limit}")
        count, rate = request_count(self.burst, self.rate, self.duration_s)
        version = ConfigRegistry(self.conns.postgres).get(int(self.version))
        config = version.config
        if fit_stand_in(config, limit):
            self.log.info("AI stand-in set to time scale %s, limit %s", config.time_scale, limit)
        results = []
        for n in range(1, trials + 1):
            run_id = f"{self.run_id}-t{n}"
            with measured(self.conns, run_id, version) as env:
                load = drive_load(run_id, config, env.kafka, env.database_url, count, rate, self.timeout_s)
            self.log.info("trial %d/%d (%s): %s in %.1fs", n, trials, run_id, load["counts"], load["seconds"])
            results.append({"run_id": run_id, **load})
        conditions = {"time_scale": config.time_scale, "ai_limit": limit, "requests": count, "rate": rate}
        return {"run_ids": [r["run_id"] for r in results], "trials": results, "ai_limit": limit,
                "conditions": conditions}
