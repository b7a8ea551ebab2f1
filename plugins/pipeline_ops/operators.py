"""Airflow operators of the platform. Each is a thin shell around the runtime (`consumers`),
the registry and the gate, built on the provider hooks for its connections."""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from dataclasses import asdict, replace
from typing import Any

import requests
from airflow.providers.apache.kafka.hooks.client import KafkaAdminClientHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.postgres.hooks.postgres import PostgresHook
from airflow.providers.standard.operators.branch import BaseBranchOperator
from airflow.sdk import BaseHook, BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from consumers import acls, capacity, events, pipeline_spec, presets
from consumers.kafka_connection import KafkaAccess
from consumers.pipeline import Pipeline
from consumers.pipeline_config import PipelineConfig
from consumers.pipeline_spec import PipelineSpec
from consumers.provisioning import TopicReport, provision
from consumers.run_figures import ATTEMPTS_SQL, attempt_costs, burst_figures
from measure import figures as measure
from measure.sizing import SizingInput, size
from pipeline_ops import gate, pipeline_check, report
from pipeline_ops.connections import database_url, kafka_access
from pipeline_ops.fleets import FleetEnvironment, FleetSupervisor, backend_for
from pipeline_ops.registry import ConfigRegistry


def base_url(conn_id: str) -> str:
    """An HTTP connection's base URL (its schema is the scheme, as for the HTTP provider's hook)."""
    conn = BaseHook.get_connection(conn_id)
    return f"{conn.schema or 'http'}://{conn.host}" + (f":{conn.port}" if conn.port else "")


def endpoint_urls(spec: PipelineSpec) -> dict[str, str]:
    """Each AI endpoint of the spec: its Airflow connection's base URL, and its path."""
    return {name: base_url(e.connection) + e.path for name, e in spec.endpoints.items()}


def configure_stand_in(spec: PipelineSpec, time_scale: float, limit: int) -> list[str]:
    """Set the time scale and each endpoint's concurrency limit for a run on the AI stand-in.

    Only on the connections of the spec's endpoints that say they are the stand-in (extra
    `stand_in`): a real AI endpoint is never reconfigured. Returns the connections configured.
    """
    names: dict[str, list[str]] = defaultdict(list)
    for name, endpoint in spec.endpoints.items():
        names[endpoint.connection].append(name)
    configured = []
    for conn_id, endpoints in sorted(names.items()):
        if str(BaseHook.get_connection(conn_id).extra_dejson.get("stand_in", "")).lower() != "true":
            continue
        response = requests.put(f"{base_url(conn_id)}/v1/config", timeout=10, json={
            "time_scale": time_scale, **{name: {"limit": limit} for name in endpoints}})
        response.raise_for_status()
        configured.append(conn_id)
    return configured


def endpoint_keys(spec: PipelineSpec) -> dict[str, str]:
    """Each AI endpoint's key: its Airflow connection's password, when it has one."""
    passwords = {conn_id: BaseHook.get_connection(conn_id).password
                 for conn_id in {e.connection for e in spec.endpoints.values()}}
    return {name: password for name, e in spec.endpoints.items() if (password := passwords[e.connection])}


def fleet_environment(kafka_config_id: str, postgres_conn_id: str, spec: PipelineSpec) -> FleetEnvironment:
    """Addresses, principals and keys for the fleet processes of a pipeline, from the Airflow
    connections."""
    return FleetEnvironment(kafka=kafka_access(kafka_config_id), database_url=database_url(postgres_conn_id),
                            ai_urls=endpoint_urls(spec), ai_keys=endpoint_keys(spec))


def provision_topics(kafka_config_id: str, topics: events.Topics, partitions: int, profile: str,
                     replication_factor: int | None) -> list[TopicReport]:
    """Create or grow a run's topics (its pipeline's) through the `kafka_default` admin client,
    and grant each role's principal its own topics and group on a secured cluster."""
    admin = KafkaAdminClientHook(kafka_config_id=kafka_config_id).get_conn
    reports = provision(admin, topics.all(), partitions, profile, replication_factor)
    acls.grant(admin, topics, kafka_access(kafka_config_id))
    return reports


def request_count(burst: int | str, rate: float | str, duration_s: float | str) -> tuple[int, float | None]:
    """(requests to send, rate or None for a burst) from the form's load fields."""
    rate_value = float(rate or 0) or None
    count = round(rate_value * float(duration_s or 0)) if rate_value else int(burst or 0)
    if count <= 0:
        raise ValueError("nothing to send: give a burst, or a rate with a duration")
    return count, rate_value


def drive_load(run_id: str, config: PipelineConfig, kafka: KafkaAccess, database_url: str, count: int,
               rate: float | None, timeout_s: float) -> dict[str, Any]:
    """Send the requests of a run and wait until each reached a final state."""
    pipeline = Pipeline(run_id, events.Topics(run_id, config.spec), config, kafka, database_url)
    started = time.time()
    sent = pipeline.send(count, rate=rate)
    counts = pipeline.wait_terminal(count, timeout_s)
    return {"produced": len(sent.request_ids), "counts": counts, "load_started": started,
            "seconds": round(time.time() - started, 2)}


class CheckPipelineOperator(BaseOperator):
    """The first task of every DAG that runs a pipeline: refuse the chosen spec before anything is
    provisioned (a mistake in it, an endpoint whose connection is not defined: the task fails
    with each field at fault, and is not retried), and return what later tasks' templates need
    of it (its completing stage, its measured topic). With a `version`, that registered
    configuration must be one of this pipeline."""

    template_fields = ("pipeline", "version")

    def __init__(self, *, pipeline: str, version: int | str | None = None,
                 postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline, self.version, self.postgres_conn_id = pipeline, version, postgres_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        try:
            spec = pipeline_check.validated(self.pipeline)
            version = int(self.version or 0)  # rendered templates are text: "" or "0" means none
            if version:
                ConfigRegistry(self.postgres_conn_id).get(version, spec.name)
        except ValueError as exc:  # SpecError is one, as is a version of another pipeline
            raise AirflowFailException(str(exc)) from None
        self.log.info("pipeline %s", spec.summary())
        return {"pipeline": spec.name, "completing_stage": spec.completing_stage,
                "measure": spec.load.measure}


class AnalysisSubmitOperator(SparkSubmitOperator):
    """spark-submit of an analysis job with the Kafka connection and the database URL in the
    driver's environment, where the job reads them: on its command line, `ps` and the task log
    would show their secrets."""

    def __init__(self, *, kafka_config_id: str = "kafka_default",
                 postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kafka_config_id, self.postgres_conn_id = kafka_config_id, postgres_conn_id

    def execute(self, context: Any) -> None:
        self.env_vars = {**(self.env_vars or {}), **kafka_access(self.kafka_config_id).default.environment(),
                         "DATABASE_URL": database_url(self.postgres_conn_id)}
        super().execute(context)


class ResolveCandidateOperator(BaseOperator):
    """Turn the trigger form's candidate (a preset of the pipeline, or its `active` version) into
    a registered version."""

    template_fields = ("pipeline", "candidate", "overrides", "preset_params")

    def __init__(self, *, candidate: str, pipeline: str = pipeline_spec.REFERENCE,
                 overrides: dict | str | None = None, preset_params: dict | None = None,
                 run_prefix: str = "tuning", postgres_conn_id: str = "postgres_default",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.candidate, self.pipeline, self.overrides = candidate, pipeline, overrides or {}
        self.preset_params, self.run_prefix = preset_params or {}, run_prefix
        self.postgres_conn_id = postgres_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        registry = ConfigRegistry(self.postgres_conn_id)
        overrides = (json.loads(self.overrides) if isinstance(self.overrides, str) else self.overrides) or {}
        if overrides.get("pipeline", self.pipeline) != self.pipeline:
            raise ValueError(f"the overrides name the pipeline {overrides['pipeline']}: choose the pipeline "
                             f"with the form's `pipeline` field ({self.pipeline})")
        active = registry.active(self.pipeline) if self.candidate == "active" else None
        if active is not None:
            config, name = active.config, active.name
        else:
            name = "flow" if self.candidate == "active" else self.candidate
            if self.candidate == "active":
                self.log.info("no active configuration of %s yet: measuring the %s preset",
                              self.pipeline, name)
            defaults = presets.PresetParams(pipeline=self.pipeline)
            params = replace(defaults, **{k: type(getattr(defaults, k))(v)  # form values may be text
                                          for k, v in self.preset_params.items() if hasattr(defaults, k)})
            config = presets.build(name, params)
        config = PipelineConfig.from_dict({**config.to_dict(), **overrides})
        version = registry.register(name, config, note=f"from {context['run_id']}")
        run_id = f"{self.run_prefix}-{context['ts_nodash'].lower()}-v{version}"
        self.log.info("candidate %s of %s is version %d; run %s", name, self.pipeline, version, run_id)
        return {"version": version, "name": name, "pipeline": config.pipeline, "run_id": run_id,
                "config": config.to_dict()}


class ProvisionTopicsOperator(BaseOperator):
    """Create or grow a pipeline's topics from a profile; partitions given or sized from rates."""

    template_fields = ("pipeline", "prefix", "partitions", "profile", "replication_factor", "target_rps",
                       "produce_rps", "consume_rps")

    def __init__(self, *, prefix: str, pipeline: str = pipeline_spec.REFERENCE, profile: str = "durability",
                 partitions: int | str | None = None, replication_factor: int | str | None = None,
                 target_rps: float | str | None = None,
                 produce_rps_per_partition: float | str = 50_000.0,
                 consume_rps_per_partition: float | str | None = None,
                 kafka_config_id: str = "kafka_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prefix, self.pipeline, self.profile, self.partitions = prefix, pipeline, profile, partitions
        self.replication_factor, self.target_rps = replication_factor, target_rps
        self.produce_rps = produce_rps_per_partition
        self.consume_rps = consume_rps_per_partition
        self.kafka_config_id = kafka_config_id

    def execute(self, context: Any) -> dict[str, Any]:
        partitions = int(self.partitions) if self.partitions else None
        reasoning = None
        if partitions is None:
            if not self.target_rps or not self.consume_rps:
                raise ValueError("give the partitions, or a target rate and the measured per-partition "
                                 "consume rate to size them from")
            sizing = size(SizingInput(float(self.target_rps), float(self.produce_rps),
                                      float(self.consume_rps)))
            partitions, reasoning = sizing["partitions"], "; ".join(sizing["reasoning"])
            self.log.info(reasoning)
        rf = int(self.replication_factor) if self.replication_factor else None
        topics = events.Topics(self.prefix, pipeline_spec.load(self.pipeline))
        reports = provision_topics(self.kafka_config_id, topics, partitions, self.profile, rf)
        for r in reports:
            self.log.info("%s: %s, %d partitions, RF %d %s", r.topic, r.action, r.partitions,
                          r.replication_factor, "; ".join(r.warnings))
        return {"partitions": partitions, "sizing": reasoning, "topics": [asdict(r) for r in reports]}


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
        self.conns = (kafka_config_id, postgres_conn_id)
        self.fleet_conn_id = fleet_conn_id

    def execute(self, context: Any) -> Any:
        if self.action not in ("start", "scale", "check", "stop"):
            raise ValueError(f"unknown action {self.action!r}: start, scale, check or stop")
        fleets = backend_for(self.fleet_conn_id, self.conns[1])
        if self.action == "stop":
            return fleets.stop(self.run_id)
        if self.action == "check":
            return fleets.check(self.run_id)
        if self.version is None:
            raise ValueError(f"{self.action} needs the configuration version")
        version = ConfigRegistry(self.conns[1]).get(int(self.version))
        config = version.config
        n = int(self.members or 0)  # rendered templates are text: "0" means the version's own
        if n:
            config = config.with_stages(**{s: replace(config.stage(s), members=n)
                                           for s in config.spec.ai_stages})
        if self.ai_limit and configure_stand_in(config.spec, config.time_scale, int(self.ai_limit)):
            self.log.info("AI stand-in set to time scale %s, limit %s", config.time_scale, self.ai_limit)
        deploy = fleets.scale if self.action == "scale" else fleets.start
        running = deploy(self.run_id, version.version, config, fleet_environment(*self.conns, config.spec))
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
        count, rate = request_count(self.burst, self.rate, self.duration_s)
        config = ConfigRegistry(self.postgres_conn_id).get(int(self.version)).config
        result = drive_load(self.run_id, config, kafka_access(self.kafka_config_id),
                            database_url(self.postgres_conn_id), count, rate, self.timeout_s)
        self.log.info("run %s: %d requests sent, final states %s", self.run_id, count, result["counts"])
        return result


class TrialsOperator(BaseOperator):
    """Measure a configuration version `trials` times, one trial after the other: each gets
    fresh topics (`<run_id>-t<n>.*`), the version's fleets deployed, the load, and its fleets
    stopped again.

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
                 postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id, self.version, self.trials, self.ai_limit = run_id, version, trials, ai_limit
        self.burst, self.rate, self.duration_s, self.timeout_s = burst, rate, duration_s, timeout_s
        self.conns = (kafka_config_id, postgres_conn_id)

    def execute(self, context: Any) -> dict[str, Any]:
        trials, limit = int(self.trials), int(self.ai_limit)
        if trials < 2:
            raise ValueError(f"trials must be at least 2 (the gate decides on confidence bounds), "
                             f"got {trials}")
        if limit < 1:
            raise ValueError(f"ai_limit must be a positive concurrency, got {limit}")
        count, rate = request_count(self.burst, self.rate, self.duration_s)
        version = ConfigRegistry(self.conns[1]).get(int(self.version))
        config = version.config
        if configure_stand_in(config.spec, config.time_scale, limit):
            self.log.info("AI stand-in set to time scale %s, limit %s", config.time_scale, limit)
        supervisor, env = FleetSupervisor(self.conns[1]), fleet_environment(*self.conns, config.spec)
        results = []
        for n in range(1, trials + 1):
            run_id = f"{self.run_id}-t{n}"
            provision_topics(self.conns[0], events.Topics(run_id, config.spec), config.partitions,
                             config.profile, config.replication_factor)
            supervisor.start(run_id, version.version, config, env)
            try:
                load = drive_load(run_id, config, env.kafka, env.database_url, count, rate,
                                  self.timeout_s)
            finally:
                supervisor.stop(run_id)
            self.log.info("trial %d/%d (%s): %s in %.1fs", n, trials, run_id, load["counts"], load["seconds"])
            results.append({"run_id": run_id, **load})
        conditions = {"time_scale": config.time_scale, "ai_limit": limit, "requests": count, "rate": rate}
        return {"run_ids": [r["run_id"] for r in results], "trials": results, "ai_limit": limit,
                "conditions": conditions}


def trial_figures(hook: PostgresHook, spec: PipelineSpec, run_id: str, produced: int,
                  ai_limit: int) -> dict[str, Any]:
    """One trial's figures as the gate sees them: the Spark analysis of its run and the skew of
    its pipeline's measured topic, turned into figures by measure.figures, with the skew's
    diagnosis (measure.skew) for the report and the gate page, and its cost from its attempt
    rows (measure.cost)."""
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
    return {"run_id": run_id, **figures, "skew_diagnosis": skew[4], "skew_recommendation": skew[5],
            "cost": attempt_costs(attempts, figures["completed"], spec)}


class PromotionGateOperator(BaseBranchOperator):
    """Decide on the candidate's trials, record the decision with its figures, branch to
    promote/reject. The reference is the last passed measurement under the same conditions of
    the active version of the candidate's pipeline: for the active version itself (the nightly
    run) its own, and a failed re-measurement of the active version raises a regression alarm."""

    template_fields = ("candidate", "trials", "target_utilization", "min_throughput_rps", "tolerance",
                       "max_skew", "max_cost_per_request")

    def __init__(self, *, candidate: Any, trials: Any, target_utilization: float | str = 0.9,
                 min_throughput_rps: float | str = 0.0, tolerance: float | str = 0.1,
                 max_skew: float | str = 2.0, max_cost_per_request: float | str = 0.0,
                 promote_task_id: str = "promote", reject_task_id: str = "reject",
                 postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.candidate, self.trials = candidate, trials
        self.target_utilization, self.min_throughput_rps = target_utilization, min_throughput_rps
        self.tolerance, self.max_skew = tolerance, max_skew
        self.max_cost_per_request = max_cost_per_request
        self.promote_task_id, self.reject_task_id = promote_task_id, reject_task_id
        self.postgres_conn_id = postgres_conn_id

    def choose_branch(self, context: Any) -> str:
        thresholds = gate.Thresholds(float(self.target_utilization), float(self.min_throughput_rps),
                                     float(self.tolerance), float(self.max_skew),
                                     max_cost_per_request=float(self.max_cost_per_request))
        candidate, measured = _as_dict(self.candidate), _as_dict(self.trials)
        if not measured or not measured.get("trials"):
            raise RuntimeError("no trials to decide on: the trials task returned nothing")
        registry = ConfigRegistry(self.postgres_conn_id)
        spec = pipeline_spec.load(candidate["pipeline"])
        trials = [trial_figures(registry.hook, spec, t["run_id"], t["produced"], measured["ai_limit"])
                  for t in measured["trials"]]
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


class CapacitySearchOperator(BaseOperator):
    """Search a version's max sustainable rate (consumers.capacity) on a deployment of its own:
    a calibration burst measures the AI capacity, steady-rate steps bisect from just below it,
    and the result goes to the registry beside the configuration, with a plot of the lag and
    the p99 of every step in `results/<run id>/`."""

    template_fields = ("run_id", "version", "ai_limit", "burst", "step_s", "p99_objective_s",
                       "lag_growth", "precision", "max_steps")

    def __init__(self, *, run_id: str, version: int | str, ai_limit: int | str, burst: int | str,
                 step_s: float | str = 20.0, p99_objective_s: float | str = 10.0,
                 lag_growth: float | str = 0.05, precision: float | str = 0.03, max_steps: int | str = 8,
                 timeout_s: float = 900, kafka_config_id: str = "kafka_default",
                 postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id, self.version, self.ai_limit, self.burst = run_id, version, ai_limit, burst
        self.step_s, self.p99_objective_s, self.lag_growth = step_s, p99_objective_s, lag_growth
        self.precision, self.max_steps, self.timeout_s = precision, max_steps, timeout_s
        self.conns = (kafka_config_id, postgres_conn_id)

    def execute(self, context: Any) -> dict[str, Any]:
        limit, burst = int(self.ai_limit), int(self.burst)
        if limit < 1 or burst < 1:
            raise ValueError(f"ai_limit and burst must be positive, got {limit} and {burst}")
        objective = capacity.Objective(p99_s=float(self.p99_objective_s),
                                       lag_growth=float(self.lag_growth), step_s=float(self.step_s),
                                       precision=float(self.precision), max_steps=int(self.max_steps))
        registry = ConfigRegistry(self.conns[1])
        version = registry.get(int(self.version))
        config = version.config
        objective = replace(objective, p99_s=objective.p99_s * config.time_scale)  # given at real scale
        configure_stand_in(config.spec, config.time_scale, limit)
        topics = events.Topics(self.run_id, config.spec)
        provision_topics(self.conns[0], topics, config.partitions, config.profile, config.replication_factor)
        supervisor, env = FleetSupervisor(self.conns[1]), fleet_environment(*self.conns, config.spec)
        supervisor.start(self.run_id, version.version, config, env)
        pipeline = Pipeline(self.run_id, topics, config, env.kafka, env.database_url)
        numbers = itertools.count(1)

        def step(rate: float) -> capacity.Step:
            run_id = f"{self.run_id}-s{next(numbers)}"
            result = capacity.run_step(pipeline, run_id, rate, objective, limit, self.timeout_s)
            self.log.info("step at %.2f rps: %s", rate, result.summary())
            return result

        try:
            calibration = burst_figures(pipeline, f"{self.run_id}-calibrate", burst, limit, self.timeout_s)
            if not calibration["capacity_rps"]:
                raise RuntimeError("the calibration burst measured no AI capacity: no call succeeded")
            self.log.info("calibration: AI capacity %.2f rps", calibration["capacity_rps"])
            best, steps = capacity.search(step, 0.9 * calibration["capacity_rps"], objective)
        finally:
            supervisor.stop(self.run_id)
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

