"""The configuration registry in PostgreSQL: versions, each of one pipeline, the one active
version per pipeline, promotions, rollbacks, the gate's decisions, regression alarms and capacity
searches (schema: infra/migrations/0003_registry.sql, 0007_gate_history.sql and
0009_registry_pipelines.sql)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from airflow.providers.postgres.hooks.postgres import PostgresHook

from consumers.config.candidate import PipelineConfig
from pipeline_ops.connections import transaction


@dataclass(frozen=True)
class Version:
    version: int
    name: str
    config: PipelineConfig
    active: bool

    @property
    def pipeline(self) -> str:
        return self.config.pipeline


class ConfigRegistry:
    """Reads and writes the registry through the `postgres_default` connection (or another)."""

    def __init__(self, postgres_conn_id: str = "postgres_default") -> None:
        self.hook = PostgresHook(postgres_conn_id=postgres_conn_id)

    def _one(self, sql: str, params: tuple = ()) -> tuple | None:
        return self.hook.get_first(sql, parameters=params)

    def register(self, name: str, config: PipelineConfig, note: str = "") -> int:
        """Store a configuration; an identical one already stored is reused, not duplicated."""
        existing = self._one("SELECT version FROM configurations WHERE config = %s::jsonb "
                             "ORDER BY version LIMIT 1", (config.to_json(),))
        if existing:
            return existing[0]
        return self._write("INSERT INTO configurations (name, pipeline, config, note) "
                           "VALUES (%s, %s, %s, %s) RETURNING version",
                           (name, config.pipeline, config.to_json(), note))[0]

    def get(self, version: int, pipeline: str | None = None) -> Version:
        """A registered version; with `pipeline`, refused when it is a configuration of another."""
        row = self._one("SELECT version, name, config, active FROM configurations WHERE version = %s",
                        (version,))
        if row is None:
            raise ValueError(f"no configuration version {version}")
        found = Version(row[0], row[1], PipelineConfig.from_dict(row[2]), row[3])
        if pipeline is not None and found.pipeline != pipeline:
            raise ValueError(f"version {version} is a configuration of {found.pipeline}, not of {pipeline}")
        return found

    def active(self, pipeline: str) -> Version | None:
        """The active configuration of a pipeline."""
        row = self._one("SELECT version FROM configurations WHERE active AND pipeline = %s", (pipeline,))
        return self.get(row[0]) if row else None

    def actives(self) -> list[dict[str, Any]]:
        """The active version of each pipeline that has one, by pipeline name (as listed, without
        reading their configurations: a pipeline whose spec is gone is still shown)."""
        rows = self.hook.get_records("SELECT version, name, pipeline FROM configurations WHERE active "
                                     "ORDER BY pipeline")
        return [dict(zip(("version", "name", "pipeline"), r, strict=True)) for r in rows]

    def pipelines(self) -> list[str]:
        """The pipelines with a registered configuration."""
        return [row[0] for row in self.hook.get_records("SELECT DISTINCT pipeline FROM configurations "
                                                        "ORDER BY 1")]

    def versions(self) -> list[dict[str, Any]]:
        """Every registered version, newest first (the rollback form offers them)."""
        keys = ("version", "name", "pipeline", "active", "created_at")
        rows = self.hook.get_records("SELECT version, name, pipeline, active, created_at FROM configurations "
                                     "ORDER BY version DESC")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def reference(self, version: int, conditions: dict[str, Any]) -> list[float] | None:
        """Steady throughputs of the trials of the version's latest passed decision measured
        under the same conditions (time scale, AI limit, load): what a candidate, or the version
        itself re-measured, is compared with. None when there is none."""
        row = self._one("SELECT figures FROM gate_decisions WHERE candidate = %s AND passed "
                        "AND figures->'conditions' = %s::jsonb ORDER BY decided_at DESC, id DESC LIMIT 1",
                        (version, json.dumps(conditions)))
        return [t["steady_throughput_rps"] for t in row[0]["trials"]] if row else None

    def record_decision(self, run_id: str, candidate: int, active_before: int | None, passed: bool,
                        reasons: list[dict[str, Any]], figures: dict[str, Any],
                        thresholds: dict[str, Any]) -> int:
        return self._write(
            "INSERT INTO gate_decisions (run_id, candidate, active_before, passed, reasons, figures, "
            "thresholds) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (run_id, candidate, active_before, passed, json.dumps(reasons), json.dumps(figures),
             json.dumps(thresholds)))[0]

    def activate(self, version: int, action: str, run_id: str | None = None,
                 figures: dict[str, Any] | None = None, reason: str = "") -> int | None:
        """Make `version` the one active configuration of its pipeline and log it; return the
        version active before. Activating the active version is a no-op (nothing logged): it
        returns `version`."""
        pipeline = self.get(version).pipeline  # and a clear error for an unknown version
        with transaction(self.hook) as cur:
            cur.execute("SELECT version FROM configurations WHERE active AND pipeline = %s FOR UPDATE",
                        (pipeline,))
            row = cur.fetchone()
            previous = row[0] if row else None
            if previous == version:
                return previous
            cur.execute("UPDATE configurations SET active = false WHERE active AND pipeline = %s",
                        (pipeline,))
            cur.execute("UPDATE configurations SET active = true WHERE version = %s", (version,))
            cur.execute("INSERT INTO promotions (version, previous, action, run_id, figures, reason) "
                        "VALUES (%s, %s, %s, %s, %s, %s)",
                        (version, previous, action, run_id, json.dumps(figures or {}), reason))
        return previous

    def rollback(self, pipeline: str, to_version: int | None = None, reason: str = "") -> tuple[int, int]:
        """Re-activate `to_version` (a version of `pipeline`), or the version of the pipeline that
        was active before the current one became active (its latest activation's predecessor);
        return (the version that was active, the version now active)."""
        if to_version is not None:
            self.get(to_version, pipeline)
        active = self.active(pipeline)
        if active is None:
            raise ValueError(f"no version of {pipeline} is active: nothing to roll back")
        if to_version is None:
            row = self._one("SELECT previous FROM promotions WHERE version = %s AND previous IS NOT NULL "
                            "AND previous <> version ORDER BY id DESC LIMIT 1", (active.version,))
            if row is None:
                raise ValueError(f"nothing to roll back to: version {active.version} has no predecessor")
            to_version = row[0]
        if to_version == active.version:
            raise ValueError(f"version {to_version} is already active: nothing to roll back")
        self.activate(to_version, "rollback", reason=reason)
        return active.version, to_version

    def history(self, limit: int = 20) -> list[dict[str, Any]]:
        keys = ("at", "action", "version", "name", "pipeline", "previous", "run_id", "reason")
        rows = self.hook.get_records(
            "SELECT p.at, p.action, p.version, c.name, c.pipeline, p.previous, p.run_id, p.reason "
            "FROM promotions p "
            "JOIN configurations c USING (version) ORDER BY p.id DESC LIMIT %s", parameters=(limit,))
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def raise_alarm(self, version: int, decision_id: int, run_id: str, failed: list[dict[str, Any]]) -> int:
        """Record that a re-measurement of the active version failed the gate."""
        return self._write("INSERT INTO regression_alarms (version, decision_id, run_id, failed) "
                           "VALUES (%s, %s, %s, %s) RETURNING id",
                           (version, decision_id, run_id, json.dumps(failed)))[0]

    def alarms(self, limit: int = 10) -> list[dict[str, Any]]:
        """The latest alarms, newest first, with whether their version is still the active one."""
        keys = ("id", "version", "name", "pipeline", "decision_id", "run_id", "failed", "raised_at", "active")
        rows = self.hook.get_records(
            "SELECT a.id, a.version, c.name, c.pipeline, a.decision_id, a.run_id, a.failed, a.raised_at, "
            "c.active "
            "FROM regression_alarms a JOIN configurations c USING (version) ORDER BY a.id DESC LIMIT %s",
            parameters=(limit,))
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def record_capacity(self, version: int, run_id: str, max_sustainable_rps: float | None,
                        ai_capacity_rps: float, objective: dict[str, Any],
                        steps: list[dict[str, Any]]) -> int:
        """Store a capacity search's result beside the version's configuration."""
        return self._write("INSERT INTO capacity_searches (version, run_id, max_sustainable_rps, "
                           "ai_capacity_rps, objective, steps) VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
                           (version, run_id, max_sustainable_rps, ai_capacity_rps, json.dumps(objective),
                            json.dumps(steps)))[0]

    def capacity_searches(self, limit: int = 10) -> list[dict[str, Any]]:
        """The latest capacity searches, newest first."""
        keys = ("id", "version", "name", "pipeline", "run_id", "max_sustainable_rps", "ai_capacity_rps",
                "objective", "steps", "searched_at")
        rows = self.hook.get_records(
            "SELECT s.id, s.version, c.name, c.pipeline, s.run_id, s.max_sustainable_rps, s.ai_capacity_rps, "
            "s.objective, s.steps, s.searched_at FROM capacity_searches s "
            "JOIN configurations c USING (version) ORDER BY s.id DESC LIMIT %s", parameters=(limit,))
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def _write(self, sql: str, params: tuple) -> tuple:
        with transaction(self.hook) as cur:
            cur.execute(sql, params)
            return cur.fetchone()
