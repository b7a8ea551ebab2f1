"""Deploy a configuration's consumer fleets to Kubernetes, through the cncf.kubernetes provider's
`KubernetesHook` on the Airflow connection that selects this backend (pipeline_ops.fleets).

The objects are those of `manifests`. Kubernetes starts a pod again when its fleet crashes or
exits because its member died (exit 70), as supervisord does a program. `check` reads each
Deployment's ready replicas and its pods' restarts and failures; `stop` deletes the run's objects
by their labels and waits until its pods have terminated, each after draining on SIGTERM. The
`deployments` rows name `<namespace>/<deployment>`; a pod's exit code goes with the pod, so none
is recorded.

    python -m pipeline_ops.fleets.kubernetes render --run-id r1 --preset flow > fleet.yaml
    python -m pipeline_ops.fleets.kubernetes render --run-id t1 --pipeline text_moderation \\
        --ai-base-url https://ai.example > fleet.yaml
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path

import yaml
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from kubernetes.client import V1Deployment, V1Pod
from kubernetes.client.rest import ApiException

from consumers.config import kafka_connection, pipeline_spec, presets
from consumers.config.candidate import Endpoints, PipelineConfig
from consumers.runtime.fleet_settings import member_name
from host.files import write_private
from pipeline_ops.fleets import manifests
from pipeline_ops.fleets.backend import FleetEnvironment
from pipeline_ops.fleets.records import KUBERNETES, Deployment, Records, wait_ready

log = logging.getLogger(__name__)

# Container states that do not pass by themselves: the fleet is failing, not starting.
FAILING = frozenset({"CrashLoopBackOff", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                     "CreateContainerError", "RunContainerError"})
DELETE_MARGIN_S = 30  # beyond the pods' grace period: the kubelet reporting them gone


def options_of(hook: KubernetesHook) -> manifests.Options:
    """From the connection's extra: `namespace` (the hook's own field), `fleet_image`, `keda`."""
    extra = hook.conn_extras
    return manifests.Options(namespace=hook.get_namespace() or hook.DEFAULT_NAMESPACE,
                             image=extra.get("fleet_image") or manifests.DEFAULT_IMAGE,
                             keda=str(extra.get("keda", "")).lower() in ("true", "1", "yes"))


def health_of(deployment: V1Deployment | None, pods: list[V1Pod]) -> tuple[str, str, int]:
    """(health, state, restarts) of a stage's Deployment: healthy once its rollout is done and
    every replica ready, restarting while a container is failing (the reasons are the state),
    dead when the Deployment is gone."""
    if deployment is None:
        return "dead", "NotFound", 0
    containers = [c for p in pods if p.status for c in (p.status.container_statuses or [])]
    restarts = sum(c.restart_count or 0 for c in containers)
    failing = sorted({c.state.waiting.reason for c in containers
                      if c.state and c.state.waiting and c.state.waiting.reason in FAILING})
    if deployment.metadata.deletion_timestamp:
        return "stopping", "Terminating", restarts
    if failing:
        return "restarting", ", ".join(failing), restarts
    wanted = 1 if deployment.spec.replicas is None else deployment.spec.replicas
    status = deployment.status
    ready = status.ready_replicas or 0
    rolled_out = ((status.observed_generation or 0) >= (deployment.metadata.generation or 0)
                  and (status.updated_replicas or 0) == wanted and (status.replicas or 0) == wanted)
    return ("healthy" if rolled_out and ready >= wanted else "starting"), f"ready {ready}/{wanted}", restarts


def _is_keda(obj: dict) -> bool:
    return obj["apiVersion"] == manifests.KEDA_API


class KubernetesFleets:
    """Start, scale, check and stop the fleets of one run, as Kubernetes Deployments."""

    def __init__(self, kubernetes_conn_id: str, postgres_conn_id: str = "postgres_default") -> None:
        self.hook = KubernetesHook(conn_id=kubernetes_conn_id)
        self.options = options_of(self.hook)
        self.records = Records(postgres_conn_id)

    @property
    def namespace(self) -> str:
        return self.options.namespace

    def start(self, run_id: str, version: int, config: PipelineConfig, env: FleetEnvironment,
              ready_timeout_s: float = 90.0) -> list[dict]:
        """Create every stage's objects and wait until all their members have partitions."""
        self.records.refuse_running(run_id)
        objects = manifests.render(run_id, config, env, self.options)
        try:
            self.hook.apply_from_yaml_file(yaml_objects=[o for o in objects if not _is_keda(o)],
                                           namespace=self.namespace)
            for obj in filter(_is_keda, objects):
                self.hook.create_custom_object(manifests.KEDA_GROUP, manifests.KEDA_VERSION,
                                               manifests.PLURALS[obj["kind"]], obj, self.namespace)
            for stage in config.spec.stage_names:
                self._record(run_id, version, config, stage)
            self._wait_ready(run_id, config, config.spec.stage_names, ready_timeout_s)
        except Exception:
            self.stop(run_id)  # no half-deployed run left behind
            raise
        return self.describe(run_id)

    def scale(self, run_id: str, version: int, config: PipelineConfig, env: FleetEnvironment,
              stages: tuple[str, ...] | None = None, ready_timeout_s: float = 90.0) -> list[dict]:
        """Replace `stages`' objects (default: the pipeline's AI stages) with `config`'s: at new
        member counts only the replicas (and a ScaledObject's minimum) change and the running pods
        stay; a new version rolls them."""
        stages = config.spec.ai_stages if stages is None else stages
        deployed = {d.stage: d for d in self.running(run_id)}
        missing = [stage for stage in stages if stage not in deployed]
        if missing:
            raise RuntimeError(f"run {run_id} has no running fleet for {missing}: start it first")
        rendered = {stage: manifests.stage_objects(run_id, stage, config, env, self.options)
                    for stage in stages}
        for stage in stages:
            for obj in rendered[stage]:
                self._replace(obj)
            self.records.close(deployed[stage].id, "scaled", None, None)
            self._record(run_id, version, config, stage)
        try:
            self._wait_ready(run_id, config, stages, ready_timeout_s)
        except Exception:
            self.stop(run_id)  # as supervisord's: fleets that do not get ready are stopped
            raise
        return self.describe(run_id)

    def _replace(self, obj: dict) -> None:
        """PUT a Secret or Deployment; merge-patch a KEDA object, or create one not there yet."""
        name = obj["metadata"]["name"]
        if obj["kind"] == "Secret":
            self.hook.core_v1_client.replace_namespaced_secret(name, self.namespace, obj)
        elif obj["kind"] == "Deployment":
            self.hook.apps_v1_client.replace_namespaced_deployment(name, self.namespace, obj)
        else:
            plural = manifests.PLURALS[obj["kind"]]
            try:
                self.hook.custom_object_client.patch_namespaced_custom_object(
                    manifests.KEDA_GROUP, manifests.KEDA_VERSION, self.namespace, plural, name, obj)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                self.hook.create_custom_object(manifests.KEDA_GROUP, manifests.KEDA_VERSION, plural, obj,
                                               self.namespace)

    def _record(self, run_id: str, version: int, config: PipelineConfig, stage: str) -> None:
        self.records.open(run_id, version, stage, f"{self.namespace}/{manifests.object_name(run_id, stage)}",
                          config.stage(stage).members, manifests.METRICS_PORT,
                          f"kubectl -n {self.namespace} logs --prefix -l {manifests.selector(run_id, stage)}")

    def running(self, run_id: str) -> list[Deployment]:
        return self.records.running(run_id, KUBERNETES)

    def describe(self, run_id: str) -> list[dict]:
        """The running fleets of the run as recorded (for logs and XCom)."""
        return self.records.describe(run_id, KUBERNETES)

    def _deployment(self, run_id: str, stage: str) -> V1Deployment | None:
        try:
            return self.hook.get_deployment_status(manifests.object_name(run_id, stage), self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _pods(self, run_id: str, stage: str | None = None) -> list[V1Pod]:
        return self.hook.core_v1_client.list_namespaced_pod(
            self.namespace, label_selector=manifests.selector(run_id, stage)).items

    def _health(self, run_id: str, stage: str) -> tuple[str, str, int]:
        return health_of(self._deployment(run_id, stage), self._pods(run_id, stage))

    def _assigned(self, run_id: str, stages: tuple[str, ...]) -> dict[str, int]:
        """Members per stage, of the pods there are now, that have had partitions in the run
        (a scale-up's existing members are not assigned again)."""
        members = {member_name(stage, 0, pod.metadata.name): stage for stage in stages
                   for pod in self._pods(run_id, stage) if pod.metadata.deletion_timestamp is None}
        return dict(Counter(members[m] for m in self.records.ever_assigned(run_id, list(members))))

    def _wait_ready(self, run_id: str, config: PipelineConfig, stages: tuple[str, ...],
                    timeout_s: float) -> None:
        """Ready as records.wait_ready says; a fleet that fails first is explained by its pods'
        state and where its logs are."""
        def reasons(down: dict[str, str]) -> str:
            return "\n".join(f"--- {d.stage}: {self._health(run_id, d.stage)[1]}; logs: {d.log_file}"
                             for d in self.running(run_id) if d.stage in down)

        wait_ready(run_id, config, stages, timeout_s, lambda: self.check(run_id),
                   lambda: self._assigned(run_id, stages), reasons)

    def check(self, run_id: str) -> dict[str, str]:
        """Health of each stage's fleet from its Deployment and pods, recorded in the table with
        the ready replicas (or the failure) and the pods' restarts."""
        result = {}
        for d in self.running(run_id):
            health, state, restarts = self._health(run_id, d.stage)
            self.records.hook.run(
                "UPDATE deployments SET health = %s, process_state = %s, restarts = GREATEST(restarts, %s), "
                "checked_at = now() WHERE id = %s", parameters=(health, state, restarts, d.id))
            result[d.stage] = health
        return result

    def stop(self, run_id: str) -> dict[str, int | None]:
        """Delete the run's objects, found by their labels (so also those of a start that failed
        before recording them), and wait until its pods are gone: each gets SIGTERM and its grace
        period to drain. A fleet that was failing is recorded as failed; no exit code is known."""
        deployed = self.running(run_id)
        failing = {d.stage for d in deployed if self._health(run_id, d.stage)[0] == "restarting"}
        grace = max((p.spec.termination_grace_period_seconds or 30  # 30: Kubernetes' default
                     for p in self._pods(run_id)), default=0)
        labels = manifests.selector(run_id)
        for plural in manifests.PLURALS.values():
            try:
                self.hook.custom_object_client.delete_collection_namespaced_custom_object(
                    manifests.KEDA_GROUP, manifests.KEDA_VERSION, self.namespace, plural,
                    label_selector=labels)
            except ApiException as exc:
                if exc.status != 404:  # 404: KEDA is not installed
                    raise
        self.hook.apps_v1_client.delete_collection_namespaced_deployment(
            self.namespace, label_selector=labels, propagation_policy="Foreground")
        self.hook.core_v1_client.delete_collection_namespaced_secret(self.namespace, label_selector=labels)
        deadline = time.monotonic() + grace + DELETE_MARGIN_S
        while (left := self._pods(run_id)) and time.monotonic() < deadline:
            time.sleep(1)
        if left:
            log.warning("pods of %s still terminating after %ds: %s", run_id, grace + DELETE_MARGIN_S,
                        [p.metadata.name for p in left])
        for d in deployed:
            self.records.close(d.id, "failed" if d.stage in failing else "stopped", None, "deleted")
        return {d.stage: None for d in deployed}


def _render(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Manifests to standard output; the Secrets, which hold credentials, only to --secrets-file."""
    given = {"--database-url": args.database_url, "--ai-base-url": args.ai_base_url}
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        parser.error(f"set {', '.join(missing)} or DATABASE_URL, AI_SERVICE_URL (source .local/stack.env)")
    try:
        config = (PipelineConfig.from_argument(args.config) if args.config
                  else presets.build(args.preset, presets.PresetParams(pipeline=args.pipeline)))
    except ValueError as exc:  # a refused spec (SpecError) or configuration
        parser.error(str(exc))
    env = FleetEnvironment(kafka_connection.from_args(args, parser), args.database_url,
                           Endpoints.on(args.ai_base_url, config.spec).urls)
    options = manifests.Options(namespace=args.namespace, image=args.image, keda=args.keda)
    objects = manifests.render(args.run_id, config, env, options)
    secrets = [o for o in objects if o["kind"] == "Secret"]
    if args.secrets_file:
        write_private(args.secrets_file, yaml.safe_dump_all(secrets, sort_keys=False))
        print(f"Secrets written to {args.secrets_file} (owner-only)", file=sys.stderr)
    names = ", ".join(o["metadata"]["name"] for o in secrets)
    sys.stdout.write(f"# Secrets {names}: with --secrets-file only\n"
                     + yaml.safe_dump_all([o for o in objects if o["kind"] != "Secret"], sort_keys=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    render = commands.add_parser("render", help="a run's manifests as YAML, without a cluster")
    render.add_argument("--run-id", required=True)
    source = render.add_mutually_exclusive_group()
    source.add_argument("--preset", choices=presets.NAMES, default="flow")
    source.add_argument("--config", help="a configuration as JSON, or @file.json, instead of a preset "
                                         "(it names its own pipeline)")
    render.add_argument("--pipeline", default=pipeline_spec.REFERENCE,
                        help="the preset's pipeline: a spec's name or path")
    render.add_argument("--namespace", default=KubernetesHook.DEFAULT_NAMESPACE)
    render.add_argument("--image", default=manifests.DEFAULT_IMAGE)
    render.add_argument("--keda", action="store_true", help="ScaledObjects for the AI stages")
    render.add_argument("--secrets-file", type=Path,
                        help="write the Secrets (the fleets' credentials) to this owner-only file")
    kafka_connection.add_argument(render)
    render.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    render.add_argument("--ai-base-url", default=os.environ.get("AI_SERVICE_URL"),
                        help="where the pipeline's AI endpoints are served (each at its spec's path)")
    _render(parser.parse_args(), render)


if __name__ == "__main__":
    main()
