"""A run's consumer fleets as Kubernetes objects: plain dicts, rendered without a cluster.

Per stage of the configuration's pipeline, a `Secret` with the stage fleet's environment
(`FleetEnvironment.variables`: its own Kafka principal, the database URL, the AI endpoints and
token) and a `Deployment` of one pod per member, each running `python -m consumers.runtime.fleet ...
--members 1` with that Secret as its environment (`envFrom`), so no secret value is in the
Deployment. A pod is ready once it serves /metrics. Kubernetes stops a pod with SIGTERM, on
which the fleet's member stops taking work, finishes what is in flight within the
configuration's shutdown deadline, commits and leaves the group; the grace period before SIGKILL
is the supervisord backend's stop wait (that deadline plus `program.STOP_MARGIN_S`).

Optionally (KEDA installed), per AI stage a `ScaledObject` on the consumer lag of the stage's group
on its source topic, from the configuration's members up to the partition count (a member beyond
it would get no partition), and on a secured cluster a `TriggerAuthentication` reading the stage
principal's credentials from the same Secret: that principal may read the group and the topic,
all the scaler needs.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path

from consumers.config.candidate import PipelineConfig
from consumers.config.events import Topics
from consumers.config.kafka_connection import KafkaConnection
from pipeline_ops.fleets.backend import FleetEnvironment
from pipeline_ops.fleets.program import fleet_command, stop_wait_s

KEDA_GROUP, KEDA_VERSION = "keda.sh", "v1alpha1"
KEDA_API = f"{KEDA_GROUP}/{KEDA_VERSION}"
PLURALS = {"ScaledObject": "scaledobjects", "TriggerAuthentication": "triggerauthentications"}
DEFAULT_IMAGE = "genai-kafka-platform/fleet:local"  # infra/docker/fleet.Dockerfile
METRICS_PORT = 9400
LABEL = "genai-kafka-platform"  # prefix of the run and stage labels
RUN_LABEL, STAGE_LABEL = f"{LABEL}/run", f"{LABEL}/stage"
APP_LABELS = {"app.kubernetes.io/name": "consumer-fleet", "app.kubernetes.io/part-of": LABEL}
# librdkafka settings naming a file of this machine -> the setting that takes its PEM text.
_INLINE_PEM = {"ssl.ca.location": "ssl.ca.pem", "ssl.certificate.location": "ssl.certificate.pem",
               "ssl.key.location": "ssl.key.pem"}
# The KEDA Kafka scaler's `sasl` values, and its TLS parameters, by librdkafka setting.
_KEDA_SASL = {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256", "SCRAM-SHA-512": "scram_sha512"}
_KEDA_TLS = {"ca": "ssl.ca.pem", "cert": "ssl.certificate.pem", "key": "ssl.key.pem"}


@dataclass(frozen=True)
class Options:
    """Where and how fleets run on the cluster (the Kubernetes connection's extra)."""

    namespace: str = "default"
    image: str = DEFAULT_IMAGE
    keda: bool = False


def _dns_label(text: str, limit: int) -> str:
    """`text` as a DNS-1123 label of at most `limit` characters; when that changed it, a hash
    of the original keeps apart two texts that now read the same."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if label != text or len(label) > limit:
        label = f"{label[:limit - 9].rstrip('-')}-{hashlib.sha1(text.encode()).hexdigest()[:8]}".lstrip("-")
    return label


def object_name(run_id: str, stage: str) -> str:
    """`fleet-<run>-<stage>`: the stage's Deployment and ScaledObject (at most 45 characters,
    leaving room for the suffixes of its pods; a spec's stage name may hold `_`, which a DNS
    label may not)."""
    return _dns_label(f"fleet-{_dns_label(run_id, 30)}-{stage}", 45)


def secret_name(name: str) -> str:
    return f"{name}-env"


def labels(run_id: str, stage: str | None = None) -> dict[str, str]:
    """The labels of a run's objects (of one stage's, with `stage`)."""
    run = {**APP_LABELS, RUN_LABEL: _dns_label(run_id, 63)}
    return run if stage is None else {**run, STAGE_LABEL: stage}


def selector(run_id: str, stage: str | None = None) -> str:
    return ",".join(f"{k}={v}" for k, v in labels(run_id, stage).items())


def inline_files(connection: KafkaConnection) -> KafkaConnection:
    """The connection as a pod can use it: the files of this machine it names (a CA, a client
    certificate and key) become their PEM text, which librdkafka takes inline."""
    settings = dict(connection.settings)
    for location, pem in _INLINE_PEM.items():
        if location in settings:
            settings[pem] = Path(settings.pop(location)).read_text()
    return KafkaConnection(settings)


def keda_auth(connection: KafkaConnection) -> dict[str, str]:
    """The KEDA Kafka scaler's authentication parameters for a principal (none on an open
    cluster), from a connection with its files inlined."""
    s = connection.settings
    protocol = str(s.get("security.protocol", "PLAINTEXT")).upper()
    auth = {}
    if protocol.startswith("SASL_"):
        mechanism = s.get("sasl.mechanism") or s.get("sasl.mechanisms")
        if mechanism not in _KEDA_SASL:
            raise ValueError(f"KEDA's Kafka scaler has no SASL mechanism {mechanism!r}; "
                             f"known: {', '.join(_KEDA_SASL)}")
        auth = {"sasl": _KEDA_SASL[mechanism], "username": s["sasl.username"], "password": s["sasl.password"]}
    if protocol.endswith("SSL"):
        auth["tls"] = "enable"
        auth.update({param: s[setting] for param, setting in _KEDA_TLS.items() if setting in s})
    return auth


def keda_key(parameter: str) -> str:
    """The stage Secret's key for a KEDA parameter (the pod sees it too: its own principal's)."""
    return f"KEDA_KAFKA_{parameter.upper()}"


def lag_per_member(config: PipelineConfig, stage: str) -> int:
    """The records one member holds at once (its window, or the batch it works through): lag
    beyond that per member is work waiting for a member."""
    stage_config = config.stage(stage)
    return max(stage_config.concurrent, stage_config.batch_size)


def _metadata(name: str, run_id: str, stage: str, options: Options) -> dict:
    return {"name": name, "namespace": options.namespace, "labels": labels(run_id, stage),
            "annotations": {f"{LABEL}/run-id": run_id}}


def secret(name: str, run_id: str, stage: str, variables: dict[str, str], options: Options) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _metadata(secret_name(name), run_id, stage, options), "stringData": variables}


def deployment(name: str, run_id: str, stage: str, config: PipelineConfig, options: Options) -> dict:
    """One pod per member. Every pod's --config says one member per stage, so scaling changes
    the replicas only and never rolls the pods; each names its member after itself."""
    per_pod = config.with_stages(**{s: replace(config.stage(s), members=1) for s in config.spec.stage_names})
    command = [*fleet_command(run_id, stage, per_pod, 1, METRICS_PORT, python="python"),
               "--metrics-host", "0.0.0.0", "--instance", "$(POD_NAME)"]
    container = {
        "name": "fleet", "image": options.image, "command": command,
        "envFrom": [{"secretRef": {"name": secret_name(name)}}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
        "readinessProbe": {"httpGet": {"path": "/metrics", "port": METRICS_PORT}, "periodSeconds": 5},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _metadata(name, run_id, stage, options),
            "spec": {"replicas": config.stage(stage).members,
                     "selector": {"matchLabels": labels(run_id, stage)},
                     "template": {"metadata": {"labels": labels(run_id, stage)},
                                  "spec": {"terminationGracePeriodSeconds": stop_wait_s(config),
                                           "securityContext": {"runAsNonRoot": True},
                                           "containers": [container]}}}}


def trigger_authentication(name: str, run_id: str, stage: str, parameters: list[str],
                           options: Options) -> dict:
    """KEDA's credentials for the scaler: the parameters' values from the stage's Secret."""
    return {"apiVersion": KEDA_API, "kind": "TriggerAuthentication",
            "metadata": _metadata(name, run_id, stage, options),
            "spec": {"secretTargetRef": [{"parameter": p, "name": secret_name(name), "key": keda_key(p)}
                                         for p in parameters]}}


def scaled_object(name: str, run_id: str, stage: str, config: PipelineConfig, bootstrap: str,
                  authenticated: bool, options: Options) -> dict:
    """Between the configuration's members and one per partition, on the group's lag."""
    topics = Topics(run_id, config.spec)
    trigger = {"type": "kafka", "metadata": {
        "bootstrapServers": bootstrap, "consumerGroup": topics.group_of(stage),
        "topic": topics.source_of(stage), "lagThreshold": str(lag_per_member(config, stage)),
        "offsetResetPolicy": "earliest"}}  # as the members' consumers (profiles)
    if authenticated:
        trigger["authenticationRef"] = {"name": name}
    return {"apiVersion": KEDA_API, "kind": "ScaledObject",
            "metadata": _metadata(name, run_id, stage, options),
            "spec": {"scaleTargetRef": {"name": name}, "minReplicaCount": config.stage(stage).members,
                     "maxReplicaCount": config.partitions, "triggers": [trigger]}}


def stage_objects(run_id: str, stage: str, config: PipelineConfig, env: FleetEnvironment,
                  options: Options) -> list[dict]:
    """A stage's objects in the order they can be created: the Secret before the Deployment
    reading it, a TriggerAuthentication before the ScaledObject naming it."""
    name = object_name(run_id, stage)
    connection = inline_files(env.kafka.of(stage))
    scaled = options.keda and stage in config.spec.ai_stages
    auth = keda_auth(connection) if scaled else {}
    variables = {**env.variables(stage), **connection.environment(),
                 **{keda_key(parameter): value for parameter, value in auth.items()}}
    objects = [secret(name, run_id, stage, variables, options),
               deployment(name, run_id, stage, config, options)]
    if auth:
        objects.append(trigger_authentication(name, run_id, stage, list(auth), options))
    if scaled:
        objects.append(scaled_object(name, run_id, stage, config, connection.bootstrap, bool(auth), options))
    return objects


def render(run_id: str, config: PipelineConfig, env: FleetEnvironment, options: Options) -> list[dict]:
    """Every object of a run's fleets, stage by stage of the configuration's pipeline."""
    return [obj for stage in config.spec.stage_names
            for obj in stage_objects(run_id, stage, config, env, options)]
