"""The configuration registry in PostgreSQL: versions, the one active version, promotions,
rollbacks and the gate's decisions (schema: infra/migrations/0003_registry.sql)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from airflow.providers.postgres.hooks.postgres import PostgresHook

from consumers.pipeline_config import PipelineConfig


@dataclass(frozen=True)
class Version:
    version: int
    name: str
    config: PipelineConfig
    active: bool


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
        return self._write("INSERT INTO configurations (name, config, note) VALUES (%s, %s, %s) "
                           "RETURNING version", (name, config.to_json(), note))[0]

    def get(self, version: int) -> Version:
        row = self._one("SELECT version, name, config, active FROM configurations WHERE version = %s",
                        (version,))
        if row is None:
            raise ValueError(f"no configuration version {version}")
        return Version(row[0], row[1], PipelineConfig.from_dict(row[2]), row[3])

    def active(self) -> Version | None:
        row = self._one("SELECT version FROM configurations WHERE active")
        return self.get(row[0]) if row else None

    def last_measured(self, version: int) -> dict[str, Any] | None:
        """Figures of the version's latest passed decision, or of its promotion."""
        row = self._one("SELECT figures FROM gate_decisions WHERE candidate = %s AND passed "
                        "ORDER BY decided_at DESC LIMIT 1", (version,))
        return row[0] if row else None

    def record_decision(self, run_id: str, candidate: int, active_before: int | None, passed: bool,
                        reasons: list[dict[str, Any]], figures: dict[str, Any],
                        thresholds: dict[str, Any]) -> int:
        return self._write(
            "INSERT INTO gate_decisions (run_id, candidate, active_before, passed, reasons, figures, "
            "thresholds) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (run_id, candidate, active_before, passed, json.dumps(reasons), json.dumps(figures),
             json.dumps(thresholds)))[0]

    def activate(self, version: int, action: str, run_id: str | None = None,
                 figures: dict[str, Any] | None = None) -> int | None:
        """Make `version` the one active configuration and log it; return the previous one."""
        self.get(version)  # clear error for an unknown version
        with self._tx() as cur:
            cur.execute("SELECT version FROM configurations WHERE active FOR UPDATE")
            row = cur.fetchone()
            previous = row[0] if row else None
            cur.execute("UPDATE configurations SET active = false WHERE active")
            cur.execute("UPDATE configurations SET active = true WHERE version = %s", (version,))
            cur.execute("INSERT INTO promotions (version, previous, action, run_id, figures) "
                        "VALUES (%s, %s, %s, %s, %s)",
                        (version, previous, action, run_id, json.dumps(figures or {})))
        return previous

    def rollback(self, to_version: int | None = None) -> int:
        """Re-activate `to_version`, or the version active before the current one."""
        if to_version is None:
            row = self._one("SELECT previous FROM promotions WHERE previous IS NOT NULL "
                            "AND version = (SELECT version FROM configurations WHERE active) "
                            "ORDER BY at DESC LIMIT 1")
            if row is None:
                raise ValueError("nothing to roll back to: the active version has no predecessor")
            to_version = row[0]
        self.activate(to_version, "rollback")
        return to_version

    def history(self, limit: int = 20) -> list[dict[str, Any]]:
        rows = self.hook.get_records(
            "SELECT p.at, p.action, p.version, c.name, p.previous, p.run_id FROM promotions p "
            "JOIN configurations c USING (version) ORDER BY p.at DESC LIMIT %s", parameters=(limit,))
        return [dict(zip(("at", "action", "version", "name", "previous", "run_id"), r, strict=True))
                for r in rows]

    def _write(self, sql: str, params: tuple) -> tuple:
        with self._tx() as cur:
            cur.execute(sql, params)
            return cur.fetchone()

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        """One transaction on a fresh connection, closed afterwards."""
        conn = self.hook.get_conn()
        try:
            with conn, conn.cursor() as cur:
                yield cur
        finally:
            conn.close()
