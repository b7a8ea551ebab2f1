"""The Kubernetes fleet backend without a cluster: the manifests of the reference configuration on
a secured cluster, checked by the official client's models and for leaked secrets, and those of a
second pipeline's; the backend a connection selects; health from a Deployment's status; the
render command; the image's packages."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from unittest.mock import create_autospec

import pytest
import yaml
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from kubernetes.client import (
    ApiClient,
    AppsV1Api,
    CoreV1Api,
    CustomObjectsApi,
    V1Container,
    V1ContainerState,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Deployment,
    V1DeploymentSpec,
    V1DeploymentStatus,
    V1LabelSelector,
    V1ObjectMeta,
    V1Pod,
    V1PodList,
    V1PodSpec,
    V1PodStatus,
    V1PodTemplateSpec,
)
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from consumers.config import presets
from consumers.config.candidate import Endpoints, PipelineConfig
from consumers.config.events import Topics
from consumers.config.kafka_connection import KafkaAccess, KafkaConnection
from consumers.runtime import fleet_args
from infra.layout import REPO
from pipeline_ops import fleets
from pipeline_ops.fleets import manifests
from pipeline_ops.fleets.backend import TOKEN_ENV
from pipeline_ops.fleets.kubernetes import KubernetesFleets, health_of
from pipeline_ops.fleets.kubernetes import main as render_main
from pipeline_ops.fleets.program import fleet_program
from pipeline_ops.fleets.records import Deployment
from pipeline_ops.operators import runs
from pipeline_ops.operators.deploy import DeployFleetOperator

RUN = "r1"
CONFIG = presets.build("flow", presets.PresetParams())
STAGES = CONFIG.spec.stage_names  # intake, check, generate
AI_URLS = Endpoints.on("http://ai.example", CONFIG.spec).urls
OPTIONS = manifests.Options(namespace="pipelines", image="registry.example/fleet:1", keda=True)
PASSWORDS = {"admin": "admin-Pw-1", "intake": "intake-Pw-2", "check": "check-Pw-3",
             "generate": "generate-Pw-4"}
DB_PASSWORD, TOKEN = "db-Pw-5", "ai-Token-6"
CA = "-----BEGIN CERTIFICATE-----\nMIIBfakeCAforTests\n-----END CERTIFICATE-----\n"
SECRETS = [*PASSWORDS.values(), DB_PASSWORD, TOKEN]


def principal(user: str, ca: Path) -> KafkaConnection:
    return KafkaConnection({"bootstrap.servers": "kafka-0.kafka:9093", "security.protocol": "SASL_SSL",
                            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
                            "sasl.password": PASSWORDS[user], "ssl.ca.location": str(ca)})


@pytest.fixture
def secured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> fleets.FleetEnvironment:
    """Every stage its own SCRAM principal over TLS, a database password and an AI token."""
    ca = tmp_path / "ca.pem"
    ca.write_text(CA)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    access = KafkaAccess(principal("admin", ca), {stage: principal(stage, ca) for stage in STAGES})
    return fleets.FleetEnvironment(access, f"postgresql://pipeline:{DB_PASSWORD}@db.example:5432/pipeline",
                                   AI_URLS)


@pytest.fixture
def objects(secured: fleets.FleetEnvironment) -> list[dict]:
    return manifests.render(RUN, CONFIG, secured, OPTIONS)


def of(objects: list[dict], kind: str, stage: str) -> dict:
    (found,) = [o for o in objects
                if o["kind"] == kind and o["metadata"]["labels"][manifests.STAGE_LABEL] == stage]
    return found


@dataclass
class Body:
    """What `ApiClient.deserialize` reads of an API response: its JSON text (the client's way of
    loading a model from a manifest)."""

    data: str


def as_model(obj: dict, model: str) -> Any:
    """`obj` as the official client's model; a field the model does not know (misspelled,
    misplaced) is dropped by deserialization, so the model must serialize back to `obj`."""
    client = ApiClient()
    loaded = client.deserialize(Body(json.dumps(obj)), model)
    assert client.sanitize_for_serialization(loaded) == obj, f"{obj['kind']} is not a valid {model}"
    return loaded


# --- manifests -----------------------------------------------------------------------------------

def test_every_object_is_valid_for_the_kubernetes_client(objects: list[dict]) -> None:
    kinds = [o["kind"] for o in objects]
    assert kinds.count("Secret") == kinds.count("Deployment") == 3
    assert kinds.count("ScaledObject") == kinds.count("TriggerAuthentication") == 2  # the AI stages
    for obj in objects:
        if obj["apiVersion"] == manifests.KEDA_API:  # no model in the client: its metadata is one
            as_model(obj["metadata"], "V1ObjectMeta")
        else:
            as_model(obj, f"V1{obj['kind']}")
        assert obj["metadata"]["namespace"] == "pipelines"


def test_a_mistyped_field_fails_validation(objects: list[dict]) -> None:
    deployment = of(objects, "Deployment", "check")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 4}}
    with pytest.raises(AssertionError, match="not a valid V1Deployment"):
        as_model(broken, "V1Deployment")
    with pytest.raises(ValueError, match="containers"):  # a required field missing
        as_model({**deployment, "spec": {**deployment["spec"], "template": {"spec": {}}}}, "V1Deployment")


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_runs_one_member_per_pod_as_many_pods_as_members(objects: list[dict], stage: str) -> None:
    deployment: V1Deployment = as_model(of(objects, "Deployment", stage), "V1Deployment")
    assert deployment.spec.replicas == CONFIG.stage(stage).members
    assert deployment.spec.selector.match_labels == deployment.spec.template.metadata.labels
    assert deployment.spec.template.metadata.labels[manifests.RUN_LABEL] == RUN
    (container,) = deployment.spec.template.spec.containers
    assert container.image == "registry.example/fleet:1"
    assert container.command[:3] == ["python", "-m", "consumers.runtime.fleet"]
    args = fleet_args.parser().parse_args(container.command[3:])  # the fleet's own CLI takes it
    assert (args.stage, args.run_id, args.members) == (stage, RUN, 1)
    assert args.metrics_port == manifests.METRICS_PORT and args.metrics_host == "0.0.0.0"
    pod_config = fleet_args.config_from_args(args)
    assert pod_config.stage(stage).members == 1
    assert (pod_config.partitions, pod_config.stage(stage).window) == (CONFIG.partitions,
                                                                       CONFIG.stage(stage).window)
    assert args.instance == "$(POD_NAME)"  # Kubernetes puts the pod's name there
    assert [e.value_from.field_ref.field_path for e in container.env] == ["metadata.name"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_pod_is_ready_when_it_serves_metrics_and_drains_before_it_is_killed(objects: list[dict],
                                                                               stage: str) -> None:
    pod = as_model(of(objects, "Deployment", stage), "V1Deployment").spec.template.spec
    (container,) = pod.containers
    assert (container.readiness_probe.http_get.path, container.readiness_probe.http_get.port) == (
        "/metrics", manifests.METRICS_PORT)
    assert [p.container_port for p in container.ports] == [manifests.METRICS_PORT]
    assert pod.termination_grace_period_seconds >= CONFIG.shutdown_deadline_s
    # the same wait supervisord gives a fleet between SIGTERM and SIGKILL
    supervised = fleet_program("p", RUN, stage, CONFIG, {}).stopwaitsecs
    assert pod.termination_grace_period_seconds == supervised


@pytest.mark.parametrize("stage", STAGES)
def test_the_environment_comes_from_the_stage_secret(objects: list[dict], stage: str) -> None:
    secret = as_model(of(objects, "Secret", stage), "V1Secret")
    (container,) = as_model(of(objects, "Deployment", stage), "V1Deployment").spec.template.spec.containers
    assert [source.secret_ref.name for source in container.env_from] == [secret.metadata.name]
    assert [e.name for e in container.env] == ["POD_NAME"]  # nothing else set outside the Secret
    env = secret.string_data
    kafka = json.loads(env["KAFKA_CLIENT_CONFIG"])
    assert (kafka["sasl.username"], kafka["sasl.password"]) == (stage, PASSWORDS[stage])  # its own principal
    assert kafka["ssl.ca.pem"] == CA and "ssl.ca.location" not in kafka  # no file of this machine
    assert DB_PASSWORD in env["DATABASE_URL"] and env[TOKEN_ENV] == TOKEN
    assert json.loads(env["AI_ENDPOINTS"]) == {"check": "http://ai.example/v1/check",
                                               "generate": "http://ai.example/v1/generate"}
    others = [PASSWORDS[user] for user in PASSWORDS if user != stage]
    assert not any(password in json.dumps(env) for password in others)


@pytest.mark.parametrize("kind", ["Deployment", "ScaledObject", "TriggerAuthentication"])
def test_no_secret_value_outside_the_secrets(objects: list[dict], kind: str) -> None:
    text = yaml.safe_dump_all([o for o in objects if o["kind"] == kind]) + json.dumps(
        [o for o in objects if o["kind"] == kind])
    assert text.strip()
    leaked = [secret for secret in SECRETS if secret in text]
    assert leaked == [], f"{kind} holds secret values"


@pytest.mark.parametrize("stage", ["check", "generate"])
def test_keda_scales_an_ai_stage_on_its_lag_up_to_one_member_per_partition(objects: list[dict],
                                                                            stage: str) -> None:
    scaled, auth = of(objects, "ScaledObject", stage), of(objects, "TriggerAuthentication", stage)
    secret, deployment = of(objects, "Secret", stage), of(objects, "Deployment", stage)
    assert scaled["apiVersion"] == auth["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"name": deployment["metadata"]["name"]}
    assert spec["minReplicaCount"] == CONFIG.stage(stage).members
    assert spec["maxReplicaCount"] == CONFIG.partitions
    (trigger,) = spec["triggers"]
    topics = Topics(RUN, CONFIG.spec)
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["consumerGroup"] == topics.group_of(stage)
    assert trigger["metadata"]["topic"] == topics.source_of(stage)
    assert trigger["metadata"]["bootstrapServers"] == "kafka-0.kafka:9093"
    assert int(trigger["metadata"]["lagThreshold"]) == CONFIG.stage(stage).window
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert set(refs) == {"sasl", "username", "password", "tls", "ca"}
    assert {r["name"] for r in refs.values()} == {secret["metadata"]["name"]}
    values = {parameter: secret["stringData"][r["key"]] for parameter, r in refs.items()}
    assert values == {"sasl": "scram_sha512", "username": stage, "password": PASSWORDS[stage],
                      "tls": "enable", "ca": CA}


def test_intake_is_not_autoscaled_and_keda_is_optional(secured: fleets.FleetEnvironment,
                                                       objects: list[dict]) -> None:
    assert not [o for o in objects if o["apiVersion"] == manifests.KEDA_API
                and o["metadata"]["labels"][manifests.STAGE_LABEL] == "intake"]
    plain = manifests.render(RUN, CONFIG, secured, manifests.Options())
    assert {o["kind"] for o in plain} == {"Secret", "Deployment"}
    assert not any(key.startswith("KEDA_") for o in plain if o["kind"] == "Secret" for key in o["stringData"])


def open_cluster(config: PipelineConfig) -> fleets.FleetEnvironment:
    return fleets.FleetEnvironment(KafkaAccess.plain("kafka:9092"), "postgresql://db/pipeline",
                                   Endpoints.on("http://ai.example", config.spec).urls)


def test_an_open_cluster_needs_no_trigger_authentication() -> None:
    objects = manifests.render(RUN, CONFIG, open_cluster(CONFIG), OPTIONS)
    assert "TriggerAuthentication" not in {o["kind"] for o in objects}
    scaled = [o for o in objects if o["kind"] == "ScaledObject"]
    assert scaled and all("authenticationRef" not in o["spec"]["triggers"][0] for o in scaled)


def test_names_and_labels_are_valid_for_any_run_id() -> None:
    runs = ["manual__2026-01-01T02:00:00+00:00", "Manual__2026-01-01t02:00:00+00:00", "x" * 100]
    names = {manifests.object_name(run, "generate") for run in runs}
    assert len(names) == 3  # runs that read the same once lower-cased stay apart
    for name in names:
        as_model({"name": name, "labels": manifests.labels(runs[0], "generate")}, "V1ObjectMeta")
        assert len(name) <= 45 and name.endswith("-generate")
        assert all(c.islower() or c.isdigit() or c == "-" for c in name)
    assert manifests.object_name("tuning-20260101t020000-v7", "check") == (
        "fleet-tuning-20260101t020000-v7-check")  # a plain run id reads as it is
    spec_stage = manifests.object_name("r1", "fan_out_" + "x" * 31)  # a spec's stage: `_`, 40 characters
    as_model({"name": spec_stage}, "V1ObjectMeta")
    assert len(spec_stage) <= 45 and "_" not in spec_stage


def test_every_stage_of_another_pipeline_is_deployed_and_its_ai_stages_scaled() -> None:
    config = presets.build("flow", presets.PresetParams(pipeline="text_moderation"))
    objects = manifests.render(RUN, config, open_cluster(config), OPTIONS)
    stages = [o["metadata"]["labels"][manifests.STAGE_LABEL] for o in objects if o["kind"] == "Deployment"]
    assert stages == ["moderate", "summarize", "classify", "join"]
    scaled = [o["metadata"]["labels"][manifests.STAGE_LABEL] for o in objects if o["kind"] == "ScaledObject"]
    assert scaled == ["moderate", "summarize", "classify"]  # `join` calls no AI endpoint
    (container,) = of(objects, "Deployment", "summarize")["spec"]["template"]["spec"]["containers"]
    pod_config = fleet_args.config_from_args(fleet_args.parser().parse_args(container["command"][3:]))
    assert (pod_config.pipeline, pod_config.stage("summarize").members) == ("text_moderation", 1)
    endpoints = json.loads(of(objects, "Secret", "join")["stringData"]["AI_ENDPOINTS"])
    assert endpoints["summarize"] == "http://ai.example/v1/summarize" and len(endpoints) == 3
    trigger = of(objects, "ScaledObject", "summarize")["spec"]["triggers"][0]["metadata"]
    assert (trigger["topic"], trigger["consumerGroup"]) == (f"{RUN}.summarize", f"{RUN}.summarize")


# --- backend selection, health -------------------------------------------------------------------

def test_a_kubernetes_connection_selects_the_kubernetes_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_FLEET_DEFAULT", json.dumps({"conn_type": "kubernetes", "extra": {
        "namespace": "pipelines", "fleet_image": "registry.example/fleet:1", "keda": True}}))
    backend = fleets.backend_for("fleet_default")
    assert isinstance(backend, KubernetesFleets)
    assert backend.options == OPTIONS


def test_without_a_fleet_connection_fleets_stay_under_supervisord(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_FLEET_DEFAULT", raising=False)
    assert isinstance(fleets.backend_for("fleet_default"), fleets.FleetSupervisor)


def test_a_fleet_connection_of_another_type_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_FLEET_DEFAULT", json.dumps({"conn_type": "http", "host": "example"}))
    with pytest.raises(ValueError, match="of type 'http'"):
        fleets.backend_for("fleet_default")


def test_the_deploy_operator_acts_through_the_selected_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple] = []

    class Backend:
        def check(self, run_id: str) -> dict[str, str]:
            return {"check": "healthy"}

    monkeypatch.setattr(runs, "backend_for", lambda *conn_ids: asked.append(conn_ids) or Backend())
    op = DeployFleetOperator(task_id="d", action="check", run_id=RUN, fleet_conn_id="k8s",
                             postgres_conn_id="pg")
    assert op.execute({}) == {"check": "healthy"}
    assert asked == [("k8s", "pg")]


def deployment(replicas: int, ready: int, updated: int | None = None,
               total: int | None = None) -> V1Deployment:
    return V1Deployment(metadata=V1ObjectMeta(generation=2),
                        spec=V1DeploymentSpec(replicas=replicas, selector=V1LabelSelector(),
                                              template=V1PodTemplateSpec()),
                        status=V1DeploymentStatus(observed_generation=2, ready_replicas=ready,
                                                  updated_replicas=replicas if updated is None else updated,
                                                  replicas=replicas if total is None else total))


def pod(restarts: int, waiting: str | None = None) -> V1Pod:
    state = V1ContainerState(waiting=V1ContainerStateWaiting(reason=waiting) if waiting else None)
    return V1Pod(status=V1PodStatus(container_statuses=[V1ContainerStatus(
        name="fleet", image="i", image_id="", ready=waiting is None, restart_count=restarts, state=state)]))


def test_health_from_the_deployment_and_its_pods() -> None:
    assert health_of(deployment(4, 4), [pod(0), pod(1)]) == ("healthy", "ready 4/4", 1)
    assert health_of(deployment(4, 2), [pod(0)]) == ("starting", "ready 2/4", 0)
    assert health_of(deployment(4, 4, total=5), [])[0] == "starting"  # a rollout is not done
    assert health_of(deployment(4, 3), [pod(3, "CrashLoopBackOff"), pod(0, "ContainerCreating")]) == (
        "restarting", "CrashLoopBackOff", 3)
    assert health_of(None, []) == ("dead", "NotFound", 0)


class FakeRecords:
    """The `deployments` table in memory; every member of the pods there are is assigned."""

    def __init__(self) -> None:
        self.rows: dict[int, dict] = {}
        self.hook = self  # check's UPDATE

    def run(self, sql: str, parameters: tuple) -> None:
        self.rows[parameters[-1]]["health"] = parameters[0]

    def refuse_running(self, run_id: str) -> None:
        assert not self.running(run_id)

    def running(self, run_id: str, backend: str | None = None) -> list[Deployment]:
        return [Deployment(i, r["stage"], r["program"], None, r["port"], r["log"])
                for i, r in self.rows.items() if r["state"] == "running"]

    def describe(self, run_id: str, backend: str) -> list[dict]:
        return [{"stage": d.stage, "program": d.program} for d in self.running(run_id)]

    def open(self, run_id: str, version: int, stage: str, program: str, members: int, port: int,
             log: str) -> None:
        self.rows[len(self.rows) + 1] = {"stage": stage, "program": program, "members": members,
                                         "port": port, "log": log, "state": "running"}

    def close(self, deployment_id: int, state: str, exit_code: int | None, process_state: str | None) -> None:
        self.rows[deployment_id]["state"] = state

    def ever_assigned(self, run_id: str, members: list[str]) -> set[str]:
        return set(members)


class Cluster:
    """Autospecs of the hook and the client APIs (a call the real method would refuse fails),
    serving Deployments whose replicas are all ready until they are deleted."""

    def __init__(self) -> None:
        self.hook = create_autospec(KubernetesHook, instance=True)
        self.hook.core_v1_client = create_autospec(CoreV1Api, instance=True)
        self.hook.apps_v1_client = create_autospec(AppsV1Api, instance=True)
        self.hook.custom_object_client = create_autospec(CustomObjectsApi, instance=True)
        self.replicas: dict[str, int] = {}
        self.hook.apply_from_yaml_file.side_effect = self._create
        self.hook.apps_v1_client.replace_namespaced_deployment.side_effect = (
            lambda name, namespace, body: self._create([body]))
        self.hook.get_deployment_status.side_effect = (
            lambda name, namespace: deployment(self.replicas[name], self.replicas[name]))
        self.hook.core_v1_client.list_namespaced_pod.side_effect = self._pods
        self.hook.apps_v1_client.delete_collection_namespaced_deployment.side_effect = (
            lambda namespace, **kwargs: self.replicas.clear())

    def _create(self, yaml_objects: list[dict], namespace: str = "default") -> None:
        self.replicas.update({o["metadata"]["name"]: o["spec"]["replicas"] for o in yaml_objects
                              if o["kind"] == "Deployment"})

    def _pods(self, namespace: str, label_selector: str) -> V1PodList:
        spec = V1PodSpec(containers=[V1Container(name="fleet")], termination_grace_period_seconds=60)
        return V1PodList(items=[
            V1Pod(metadata=V1ObjectMeta(name=f"{name}-{i}"), spec=spec, status=V1PodStatus())
            for name, n in self.replicas.items() for i in range(n)
            if f"stage={name.rsplit('-', 1)[1]}" in label_selector or "stage=" not in label_selector])


def test_the_backend_drives_the_cluster_through_the_hook(secured: fleets.FleetEnvironment,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_FLEET_DEFAULT", json.dumps({"conn_type": "kubernetes", "extra": {
        "namespace": "pipelines", "keda": "true"}}))
    backend = fleets.backend_for("fleet_default")
    cluster, records = Cluster(), FakeRecords()
    backend.hook, backend.records = cluster.hook, records

    started = backend.start(RUN, 7, CONFIG, secured, ready_timeout_s=5)
    (call,) = cluster.hook.apply_from_yaml_file.call_args_list
    assert [o["kind"] for o in call.kwargs["yaml_objects"]] == ["Secret", "Deployment"] * 3
    assert call.kwargs["namespace"] == "pipelines"
    created = [c.args[2] for c in cluster.hook.create_custom_object.call_args_list]
    assert created == ["triggerauthentications", "scaledobjects"] * 2
    assert [s["program"] for s in started] == [f"pipelines/fleet-r1-{stage}" for stage in STAGES]
    assert backend.check(RUN) == dict.fromkeys(STAGES, "healthy")

    bigger = CONFIG.with_stages(check=replace(CONFIG.stage("check"), members=6))
    backend.scale(RUN, 8, bigger, secured, stages=("check",), ready_timeout_s=5)
    assert cluster.replicas["fleet-r1-check"] == 6
    cluster.hook.core_v1_client.replace_namespaced_secret.assert_called_once()
    cluster.hook.custom_object_client.patch_namespaced_custom_object.assert_called()
    assert [r["state"] for r in records.rows.values()] == ["running", "scaled", "running", "running"]

    assert backend.stop(RUN) == dict.fromkeys(STAGES)
    run_labels = manifests.selector(RUN)
    for delete in (cluster.hook.apps_v1_client.delete_collection_namespaced_deployment,
                   cluster.hook.core_v1_client.delete_collection_namespaced_secret):
        assert delete.call_args.args == ("pipelines",)
        assert delete.call_args.kwargs["label_selector"] == run_labels
    assert cluster.hook.custom_object_client.delete_collection_namespaced_custom_object.call_count == 2
    assert [r["state"] for r in records.rows.values()] == ["stopped", "scaled", "stopped", "stopped"]


# --- render command, image -----------------------------------------------------------------------

def test_render_prints_no_secret_and_writes_the_secrets_owner_only(
        secured: fleets.FleetEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in {**secured.kafka.environment(), "DATABASE_URL": secured.database_url,
                       "AI_SERVICE_URL": "http://ai.example"}.items():
        monkeypatch.setenv(key, value)
    secrets_file = tmp_path / "out" / "secrets.yaml"
    monkeypatch.setattr(sys, "argv", ["render", "render", "--run-id", RUN, "--preset", "flow", "--keda",
                                      "--secrets-file", str(secrets_file)])
    render_main()
    out, err = capsys.readouterr()
    printed = list(yaml.safe_load_all(out))
    assert {o["kind"] for o in printed} == {"Deployment", "ScaledObject", "TriggerAuthentication"}
    assert not [secret for secret in SECRETS if secret in out + err]
    assert secrets_file.stat().st_mode & 0o777 == 0o600
    written = list(yaml.safe_load_all(secrets_file.read_text()))
    assert [o["kind"] for o in written] == ["Secret"] * 3
    assert json.loads(written[1]["stringData"]["KAFKA_CLIENT_CONFIG"])["sasl.username"] == "check"
    assert json.loads(written[1]["stringData"]["AI_ENDPOINTS"]) == AI_URLS


def test_render_takes_the_pipeline_of_its_preset(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://db/pipeline")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092")
    monkeypatch.setattr(sys, "argv", ["render", "render", "--run-id", RUN, "--pipeline", "text_moderation",
                                      "--ai-base-url", "https://ai.example"])
    render_main()
    deployments = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o["kind"] == "Deployment"]
    assert [d["metadata"]["labels"][manifests.STAGE_LABEL] for d in deployments] == [
        "moderate", "summarize", "classify", "join"]


def test_render_refuses_an_unknown_pipeline(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://db/pipeline")
    monkeypatch.setattr(sys, "argv", ["render", "render", "--run-id", RUN, "--pipeline", "nope",
                                      "--ai-base-url", "https://ai.example"])
    with pytest.raises(SystemExit):
        render_main()
    assert "no such spec" in capsys.readouterr().err


def _with_dependencies(names: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name not in seen:
            seen.add(name)
            todo += [r.name for r in map(Requirement, importlib.metadata.requires(name) or [])
                     if r.marker is None or r.marker.evaluate({"extra": ""})]
    return seen


def test_the_fleet_image_installs_what_the_fleet_imports() -> None:
    """infra/docker/fleet.Dockerfile installs fleet-requirements.txt (and their dependencies)."""
    code = ("import sys; before = set(sys.modules); import consumers.runtime.fleet; "
            "print(*sorted({m.split('.')[0] for m in set(sys.modules) - before}))")
    modules = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    providers = importlib.metadata.packages_distributions()
    imported = {canonicalize_name(dist) for module in modules if module not in sys.stdlib_module_names
                for dist in providers.get(module, [])}
    listed = {line.strip() for line in (REPO / "infra/docker/fleet-requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert imported and imported <= _with_dependencies(listed)
