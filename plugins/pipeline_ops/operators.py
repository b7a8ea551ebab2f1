"""Airflow operators of the platform. Each is a thin shell around the runtime (`consumers`),
the registry and the gate, built on the provider hooks for its connections."""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, replace
from typing import Any

import requests
from airflow.providers.apache.kafka.hooks.client import KafkaAdminClientHook
from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow.providers.standard.operators.branch import BaseBranchOperator
from airflow.sdk import BaseHook, BaseOperator

from consumers import events, presets
from consumers.pipeline import Pipeline
from consumers.pipeline_config import PipelineConfig
from consumers.provisioning import provision
from pipeline_ops import gate, report
from pipeline_ops.deploy import FleetEnvironment, FleetSupervisor
from pipeline_ops.registry import ConfigRegistry
from spark.partition_sizing import SizingInput, size


def ai_base_url(ai_conn_id: str) -> str:
    ai = BaseHook.get_connection(ai_conn_id)
    return f"{ai.schema or 'http'}://{ai.host}:{ai.port}"


def configure_stand_in(ai_conn_id: str, time_scale: float, limit: int) -> bool:
    """Set the AI stand-in's time scale and concurrency limit for a run.

    Only when the connection says it is the stand-in (extra `stand_in`): a real AI endpoint is
    never reconfigured. Returns whether it was.
    """
    if str(BaseHook.get_connection(ai_conn_id).extra_dejson.get("stand_in", "")).lower() != "true":
        return False
    response = requests.put(f"{ai_base_url(ai_conn_id)}/v1/config", timeout=10, json={
        "time_scale": time_scale, "check": {"limit": limit}, "generate": {"limit": limit}})
    response.raise_for_status()
    return True


def fleet_environment(kafka_config_id: str, postgres_conn_id: str, ai_conn_id: str) -> FleetEnvironment:
    """Addresses for fleet processes, from the three Airflow connections."""
    base = ai_base_url(ai_conn_id)
    return FleetEnvironment(bootstrap=bootstrap_servers(kafka_config_id),
                            database_url=database_url(postgres_conn_id),
                            check_url=f"{base}/v1/check", generate_url=f"{base}/v1/generate")


def database_url(postgres_conn_id: str) -> str:
    """A libpq URL for the connection (the hook's URI names a SQLAlchemy driver)."""
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql://",
                  PostgresHook(postgres_conn_id=postgres_conn_id).get_uri())


def bootstrap_servers(kafka_config_id: str) -> str:
    return BaseHook.get_connection(kafka_config_id).extra_dejson["bootstrap.servers"]


class ResolveCandidateOperator(BaseOperator):
    """Turn the trigger form's candidate (a preset, or `active`) into a registered version."""

    template_fields = ("candidate", "overrides", "preset_params")

    def __init__(self, *, candidate: str, overrides: dict | str | None = None,
                 preset_params: dict | None = None, postgres_conn_id: str = "postgres_default",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.candidate, self.overrides = candidate, overrides or {}
        self.preset_params, self.postgres_conn_id = preset_params or {}, postgres_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        registry = ConfigRegistry(self.postgres_conn_id)
        overrides = json.loads(self.overrides) if isinstance(self.overrides, str) else self.overrides
        active = registry.active() if self.candidate == "active" else None
        if active is not None:
            config, name = active.config, active.name
        else:
            name = "flow" if self.candidate == "active" else self.candidate
            if self.candidate == "active":
                self.log.info("no active configuration yet: measuring the %s preset", name)
            defaults = presets.PresetParams()
            params = replace(defaults, **{k: type(getattr(defaults, k))(v)  # form values may be text
                                          for k, v in self.preset_params.items() if hasattr(defaults, k)})
            config = presets.build(name, params)
        config = PipelineConfig.from_dict({**asdict(config), **(overrides or {})})
        version = registry.register(name, config, note=f"from {context['run_id']}")
        run_id = f"tuning-{context['ts_nodash'].lower()}-v{version}"
        self.log.info("candidate %s is version %d; run %s", name, version, run_id)
        return {"version": version, "name": name, "run_id": run_id, "config": asdict(config)}


class ProvisionTopicsOperator(BaseOperator):
    """Create or grow a pipeline's topics from a profile; partitions given or sized from rates."""

    template_fields = ("prefix", "partitions", "profile", "replication_factor", "target_rps",
                       "produce_rps", "consume_rps")

    def __init__(self, *, prefix: str, profile: str = "durability", partitions: int | str | None = None,
                 replication_factor: int | str | None = None, target_rps: float | str | None = None,
                 produce_rps_per_partition: float | str = 50_000.0,
                 consume_rps_per_partition: float | str | None = None,
                 kafka_config_id: str = "kafka_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prefix, self.profile, self.partitions = prefix, profile, partitions
        self.replication_factor, self.target_rps = replication_factor, target_rps
        self.produce_rps = produce_rps_per_partition
        self.consume_rps = consume_rps_per_partition
        self.kafka_config_id = kafka_config_id

    def execute(self, context: Any) -> dict[str, Any]:
        partitions = int(self.partitions) if self.partitions else None
        reasoning = None
        if partitions is None:
            sizing = size(SizingInput(float(self.target_rps), float(self.produce_rps),
                                      float(self.consume_rps)))
            partitions, reasoning = sizing["partitions"], "; ".join(sizing["reasoning"])
            self.log.info(reasoning)
        admin = KafkaAdminClientHook(kafka_config_id=self.kafka_config_id).get_conn
        rf = int(self.replication_factor) if self.replication_factor else None
        reports = provision(admin, events.Topics(self.prefix).all(), partitions, self.profile, rf)
        for r in reports:
            self.log.info("%s: %s, %d partitions, RF %d %s", r.topic, r.action, r.partitions,
                          r.replication_factor, "; ".join(r.warnings))
        return {"partitions": partitions, "sizing": reasoning, "topics": [asdict(r) for r in reports]}


class DeployFleetOperator(BaseOperator):
    """Start, scale, check or stop the consumer fleets of a run at a configuration version.

    `scale` restarts the AI stages' supervisord programs with the new member count; `check`
    records each fleet's health and supervisord state (restarts included) and returns it.
    """

    template_fields = ("action", "run_id", "version", "members", "ai_limit")

    def __init__(self, *, action: str, run_id: str, version: int | str | None = None,
                 members: int | str | None = None, ai_limit: int | str | None = None,
                 kafka_config_id: str = "kafka_default",
                 postgres_conn_id: str = "postgres_default", ai_conn_id: str = "ai_service",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.action, self.run_id, self.version, self.members = action, run_id, version, members
        self.ai_limit = ai_limit
        self.conns = (kafka_config_id, postgres_conn_id, ai_conn_id)

    def execute(self, context: Any) -> Any:
        supervisor = FleetSupervisor(self.conns[1])
        if self.action == "stop":
            return supervisor.stop(self.run_id)
        if self.action == "check":
            return supervisor.check(self.run_id)
        if self.action not in ("start", "scale"):
            raise ValueError(f"unknown action {self.action!r}: start, scale, check or stop")
        version = ConfigRegistry(self.conns[1]).get(int(self.version))
        config = version.config
        n = int(self.members or 0)  # rendered templates are text: "0" means the version's own
        if n:
            config = replace(config, check=replace(config.check, members=n),
                             generate=replace(config.generate, members=n))
        if self.ai_limit and configure_stand_in(self.conns[2], config.time_scale, int(self.ai_limit)):
            self.log.info("AI stand-in set to time scale %s, limit %s", config.time_scale, self.ai_limit)
        deploy = supervisor.scale if self.action == "scale" else supervisor.start
        running = deploy(self.run_id, version.version, config, fleet_environment(*self.conns))
        self.log.info("fleets of %s running: %s", self.run_id, running)
        return running


class LoadTestOperator(BaseOperator):
    """Drive requests through the deployed pipeline and wait until each reached a final state."""

    template_fields = ("run_id", "version", "burst", "rate", "duration_s")

    def __init__(self, *, run_id: str, version: int | str, burst: int | str = 0, rate: float | str = 0,
                 duration_s: float | str = 0, timeout_s: float = 1800,
                 kafka_config_id: str = "kafka_default", postgres_conn_id: str = "postgres_default",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id, self.version, self.burst = run_id, version, burst
        self.rate, self.duration_s, self.timeout_s = rate, duration_s, timeout_s
        self.kafka_config_id, self.postgres_conn_id = kafka_config_id, postgres_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        config = ConfigRegistry(self.postgres_conn_id).get(int(self.version)).config
        pipeline = Pipeline(self.run_id, events.Topics(self.run_id), config,
                            bootstrap_servers(self.kafka_config_id),
                            database_url(self.postgres_conn_id))
        rate = float(self.rate) or None
        count = int(self.burst) if not rate else round(rate * float(self.duration_s))
        if count <= 0:
            raise ValueError("nothing to send: give a burst, or a rate with a duration")
        started = time.time()
        sent = pipeline.send(count, rate=rate)
        counts = pipeline.wait_terminal(count, self.timeout_s)
        self.log.info("run %s: %d requests sent, final states %s", self.run_id, count, counts)
        return {"produced": len(sent.request_ids), "counts": counts, "load_started": started,
                "seconds": round(time.time() - started, 2)}


def run_figures(hook: PostgresHook, run_id: str, produced: int) -> dict[str, Any]:
    """The gate's inputs: the Spark analysis of the run, plus lost requests from its records."""
    analysis = hook.get_first("SELECT figures FROM analysis_pipeline WHERE run_id = %s",
                              parameters=(run_id,))
    skew = hook.get_first("SELECT max_over_mean, cv FROM analysis_skew WHERE run_id = %s AND topic = %s",
                          parameters=(run_id, events.Topics(run_id).style))
    if analysis is None or skew is None:
        raise RuntimeError(f"no Spark analysis for run {run_id}: the analysis tasks did not write it")
    terminal = hook.get_first("SELECT count(*) FROM requests WHERE run_id = %s AND status IN "
                              "('completed', 'rejected', 'dead_lettered')", parameters=(run_id,))[0]
    figures = analysis[0]
    return {"throughput_rps": figures["completed_per_s"] or 0.0, "completed": figures["completed"],
            "produced": produced, "lost": produced - terminal,
            "duplicate_ai_calls": figures["duplicates"]["total"],
            "skew_max_over_mean": skew[0] or 0.0, "skew_cv": skew[1] or 0.0,
            "latency_s": figures["latency_s"], "rebalances": figures["rebalances"]["events"]}


class PromotionGateOperator(BaseBranchOperator):
    """Decide on the candidate, record the decision with its figures, branch to promote/reject."""

    template_fields = ("candidate", "load", "min_throughput_rps", "tolerance", "max_skew")

    def __init__(self, *, candidate: Any, load: Any, min_throughput_rps: float | str,
                 tolerance: float | str = 0.1, max_skew: float | str = 2.0,
                 promote_task_id: str = "promote", reject_task_id: str = "reject",
                 postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.candidate, self.load = candidate, load
        self.min_throughput_rps, self.tolerance, self.max_skew = min_throughput_rps, tolerance, max_skew
        self.promote_task_id, self.reject_task_id = promote_task_id, reject_task_id
        self.postgres_conn_id = postgres_conn_id

    def choose_branch(self, context: Any) -> str:
        candidate, load = _as_dict(self.candidate), _as_dict(self.load)
        registry = ConfigRegistry(self.postgres_conn_id)
        thresholds = gate.Thresholds(float(self.min_throughput_rps), float(self.tolerance),
                                     float(self.max_skew))
        figures = run_figures(registry.hook, candidate["run_id"], load["produced"])
        active = registry.active()
        compare = active is not None and active.version != candidate["version"]
        measured = registry.last_measured(active.version) if compare else None
        decision = gate.evaluate(figures, thresholds, measured["throughput_rps"] if measured else None)
        decision_id = registry.record_decision(candidate["run_id"], candidate["version"],
                                               active.version if active else None, decision.passed,
                                               decision.reasons(), figures, asdict(thresholds))
        self.log.info("gate decision %d for version %d: %s", decision_id, candidate["version"],
                      decision.summary())
        context["ti"].xcom_push(key="decision", value={"id": decision_id, "passed": decision.passed,
                                                       "summary": decision.summary(),
                                                       "reasons": decision.reasons(), "figures": figures})
        return self.promote_task_id if decision.passed else self.reject_task_id


class _AfterGateOperator(BaseOperator):
    """A step after the gate: it reads the gate's decision and acts on the (templated) candidate."""

    template_fields = ("candidate",)

    def __init__(self, *, candidate: Any, postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.candidate, self.postgres_conn_id = candidate, postgres_conn_id


class PromoteOperator(_AfterGateOperator):
    """Make the candidate the active configuration (or record that it already is)."""

    def execute(self, context: Any) -> dict[str, Any]:
        candidate = _as_dict(self.candidate)
        decision = context["ti"].xcom_pull(task_ids="gate", key="decision") or {}
        previous = ConfigRegistry(self.postgres_conn_id).activate(
            candidate["version"], "promote", candidate["run_id"], decision.get("figures"))
        self.log.info("version %d is active (was %s)", candidate["version"], previous)
        return {"active": candidate["version"], "previous": previous}


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


def _as_dict(value: Any) -> dict[str, Any]:
    """XCom values arrive as dicts, or as their JSON text when rendered through a template."""
    return json.loads(value) if isinstance(value, str) else value

