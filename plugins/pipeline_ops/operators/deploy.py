"""A run's consumer fleets started, scaled, checked or stopped."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from airflow.sdk import BaseOperator

from pipeline_ops.operators.runs import Connections, fit_stand_in
from pipeline_ops.registry import ConfigRegistry


class DeployFleetOperator(BaseOperator):
    """Start, scale, check or stop the consumer fleets of a run at a configuration version.

    The fleets run where `fleet_conn_id` says (pipeline_ops.fleets.backend_for): as supervisord
    programs on this machine when there is no such connection, as Kubernetes Deployments when it
    is a Kubernetes connection. `scale` runs the stages that call an AI endpoint at the new member
    count; `check` records each fleet's health (restarts included) and returns it. The AI
    endpoints are those of the version's pipeline, where their connections say.
    """

    template_fields = ("action", "run_id", "version", "members", "ai_limit")

    def __init__(self, *, action: str, run_id: str, version: int | str | None = None,
                 members: int | str | None = None, ai_limit: int | str | None = None,
                 kafka_config_id: str = "kafka_default", postgres_conn_id: str = "postgres_default",
                 fleet_conn_id: str = "fleet_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.action, self.run_id, self.version, self.members = action, run_id, version, members
        self.ai_limit = ai_limit
        self.conns = Connections(kafka_config_id, postgres_conn_id, fleet_conn_id)

    def execute(self, context: Any) -> Any:
        if self.action not in ("start", "scale", "check", "stop"):
            raise ValueError(f"unknown action {self.action!r}: start, scale, check or stop")
        fleets = self.conns.fleets()
        if self.action == "stop":
            return fleets.stop(self.run_id)
        if self.action == "check":
            return fleets.check(self.run_id)
        if self.version is None:
            raise ValueError(f"{self.action} needs the configuration version")
        version = ConfigRegistry(self.conns.postgres).get(int(self.version))
        config = version.config
        n = int(self.members or 0)  # rendered templates are text: "0" means the version's own
        if n:
            config = config.with_stages(**{s: replace(config.stage(s), members=n)
                                           for s in config.spec.ai_stages})
        if self.ai_limit and fit_stand_in(config, int(self.ai_limit)):
            self.log.info("AI stand-in set to time scale %s, limit %s", config.time_scale, self.ai_limit)
        deploy = fleets.scale if self.action == "scale" else fleets.start
        running = deploy(self.run_id, version.version, config, self.conns.environment(config))
        self.log.info("fleets of %s running: %s", self.run_id, running)
        return running
