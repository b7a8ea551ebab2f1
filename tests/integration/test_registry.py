"""The configuration registry against the test stack's PostgreSQL, in a database of its own per
test (migrated from infra/migrations), so activations here never touch the version the DAG
tests rely on. Each pipeline has its own active version."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg2
import pytest

from consumers.config.candidate import PipelineConfig
from consumers.config.pipeline_spec import REFERENCE
from infra.migrate import migrate
from pipeline_ops.registry import ConfigRegistry
from tests.stack import Stack

CONN_ID = "registry_test"


def _admin(stack: Stack, sql: str) -> None:
    conn = psycopg2.connect(stack.layout.database_url("postgres"))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


@pytest.fixture
def registry(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConfigRegistry]:
    name = f"registry_{uuid.uuid4().hex[:10]}"
    _admin(stack, f"CREATE DATABASE {name}")
    try:
        url = stack.layout.database_url(name)
        migrate(url)
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", url.replace("postgresql://", "postgres://"))
        yield ConfigRegistry(CONN_ID)
    finally:
        _admin(stack, f"DROP DATABASE {name} WITH (FORCE)")


def versions(registry: ConfigRegistry, count: int, pipeline: str = REFERENCE) -> list[int]:
    return [registry.register(f"c{i}", PipelineConfig(pipeline=pipeline, partitions=i + 1))
            for i in range(count)]


def actions(registry: ConfigRegistry) -> list[tuple[str, int, int | None, str]]:
    """The promotion log, oldest first: (action, version, previous, reason)."""
    return [(h["action"], h["version"], h["previous"], h["reason"]) for h in reversed(registry.history())]


def test_register_reuses_an_identical_configuration(registry: ConfigRegistry) -> None:
    first = registry.register("flow", PipelineConfig(partitions=4))
    assert registry.register("flow-again", PipelineConfig(partitions=4)) == first
    assert registry.register("other", PipelineConfig(partitions=5)) == first + 1
    with pytest.raises(ValueError, match="no configuration version 99"):
        registry.get(99)


def test_promoting_the_active_version_again_is_a_no_op(registry: ConfigRegistry) -> None:
    v1, v2 = versions(registry, 2)
    assert registry.activate(v1, "promote") is None
    assert registry.activate(v2, "promote") == v1
    assert registry.activate(v2, "promote", "nightly-run") == v2  # already active: nothing logged
    assert actions(registry) == [("promote", v1, None, ""), ("promote", v2, v1, "")]
    assert registry.active(REFERENCE).version == v2


def test_rollback_after_a_re_promotion_returns_to_the_previous_version(registry: ConfigRegistry) -> None:
    v1, v2 = versions(registry, 2)
    registry.activate(v1, "promote")
    registry.activate(v2, "promote")
    registry.activate(v2, "promote")  # the nightly run re-promotes the active version
    assert registry.rollback(REFERENCE, reason="v2 is slower since the upgrade") == (v2, v1)
    assert registry.active(REFERENCE).version == v1
    assert actions(registry)[-1] == ("rollback", v1, v2, "v2 is slower since the upgrade")


def test_rollback_to_a_named_version_and_back(registry: ConfigRegistry) -> None:
    v1, v2, v3 = versions(registry, 3)
    for v in (v1, v2, v3):
        registry.activate(v, "promote")
    assert registry.rollback(REFERENCE, v1, "back to the first") == (v3, v1)
    assert registry.rollback(REFERENCE) == (v1, v3)  # undo: v1 was activated from v3
    assert [a[:3] for a in actions(registry)] == [("promote", v1, None), ("promote", v2, v1),
                                                  ("promote", v3, v2), ("rollback", v1, v3),
                                                  ("rollback", v3, v1)]


def test_rollback_refuses_what_it_cannot_do(registry: ConfigRegistry) -> None:
    (v1,) = versions(registry, 1)
    with pytest.raises(ValueError, match="no version of genai_image is active"):
        registry.rollback(REFERENCE)
    registry.activate(v1, "promote")
    with pytest.raises(ValueError, match=f"version {v1} has no predecessor"):
        registry.rollback(REFERENCE)
    with pytest.raises(ValueError, match="already active"):
        registry.rollback(REFERENCE, v1)
    with pytest.raises(ValueError, match="no configuration version 42"):
        registry.rollback(REFERENCE, 42)
    assert actions(registry) == [("promote", v1, None, "")]


def test_each_pipeline_has_its_own_active_version(registry: ConfigRegistry) -> None:
    g1, g2 = versions(registry, 2)
    (t1,) = versions(registry, 1, "text_moderation")
    assert registry.get(t1).pipeline == "text_moderation" and t1 not in (g1, g2)  # same settings
    registry.activate(g1, "promote")
    assert registry.activate(t1, "promote") is None  # nothing of text_moderation was active
    registry.activate(g2, "promote")
    assert (registry.active(REFERENCE).version, registry.active("text_moderation").version) == (g2, t1)
    assert [(a["pipeline"], a["version"]) for a in registry.actives()] == [(REFERENCE, g2),
                                                                           ("text_moderation", t1)]
    assert registry.pipelines() == [REFERENCE, "text_moderation"]
    assert {v["version"]: v["pipeline"] for v in registry.versions()} == {
        g1: REFERENCE, g2: REFERENCE, t1: "text_moderation"}

    with pytest.raises(ValueError, match=f"version {g1} is a configuration of genai_image, not of text_mod"):
        registry.rollback("text_moderation", g1)
    with pytest.raises(ValueError, match="not of genai_image"):
        registry.get(t1, REFERENCE)
    assert registry.rollback(REFERENCE) == (g2, g1)
    assert registry.active("text_moderation").version == t1  # untouched by the other pipeline's rollback
    assert [h["pipeline"] for h in registry.history()] == [REFERENCE, REFERENCE, "text_moderation", REFERENCE]


def decision(registry: ConfigRegistry, version: int, passed: bool, steady: list[float],
             conditions: dict) -> int:
    trials = [{"steady_throughput_rps": s} for s in steady]
    return registry.record_decision(f"run-{uuid.uuid4().hex[:6]}", version, None, passed, [],
                                    {"trials": trials, "conditions": conditions}, {})


def test_reference_is_the_latest_passed_measurement_under_the_same_conditions(
        registry: ConfigRegistry) -> None:
    v1, v2 = versions(registry, 2)
    fast = {"time_scale": 0.05, "ai_limit": 16, "burst": 320}
    decision(registry, v1, True, [10.0, 11.0], fast)
    decision(registry, v1, True, [12.0, 13.0], fast)
    decision(registry, v1, False, [1.0, 2.0], fast)  # a failed measurement is no reference
    decision(registry, v1, True, [50.0, 51.0], {**fast, "time_scale": 0.1})
    assert registry.reference(v1, fast) == [12.0, 13.0]
    assert registry.reference(v1, {**fast, "burst": 640}) is None
    assert registry.reference(v2, fast) is None


def test_alarms_are_kept_with_their_failed_checks(registry: ConfigRegistry) -> None:
    (v1,) = versions(registry, 1)
    registry.activate(v1, "promote")
    decision_id = decision(registry, v1, False, [1.0, 2.0], {})
    failed = [{"name": "regression", "passed": False, "measured": -3.2, "required": ">= -1.3"}]
    alarm = registry.raise_alarm(v1, decision_id, "tuning-x", failed)
    (got,) = registry.alarms()
    assert (got["id"], got["version"], got["decision_id"], got["run_id"], got["failed"], got["active"]) == (
        alarm, v1, decision_id, "tuning-x", failed, True)


def test_capacity_searches_are_kept_beside_the_configuration(registry: ConfigRegistry) -> None:
    (v1,) = versions(registry, 1)
    steps = [{"rate": 45.0, "sustained": True}, {"rate": 56.25, "sustained": False}]
    search = registry.record_capacity(v1, "capacity-x", 49.2, 51.0, {"p99_s": 1.5}, steps)
    (got,) = registry.capacity_searches()
    assert (got["id"], got["version"], got["name"], got["max_sustainable_rps"], got["ai_capacity_rps"]) == (
        search, v1, "c0", 49.2, 51.0)
    assert got["pipeline"] == REFERENCE
    assert (got["objective"], got["steps"]) == ({"p99_s": 1.5}, steps)
