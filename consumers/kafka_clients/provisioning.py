"""Create or grow the pipeline's topics from a configuration profile.

Partition counts come from `--partitions` or from the sizing formula of
`measure/sizing.py` (the one place it is written) given measured rates.

    python -m consumers.kafka_clients.provisioning --prefix demo --profile durability --partitions 64
    python -m consumers.kafka_clients.provisioning --pipeline text_moderation --prefix t1 --partitions 16
    python -m consumers.kafka_clients.provisioning --prefix demo --target-rps 21.3 \\
        --produce-rps-per-partition 5000 --consume-rps-per-partition 21.3

The topics are the pipeline spec's (a spec with a mistake is refused before anything is
created). Idempotent: an existing topic with the requested shape is left alone, one with fewer
partitions is grown (never shrunk; growing moves keys to other partitions, so it warns), and
topic configs are brought to the profile's values. Impossible requests fail with a clear
message before anything is changed.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field

from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)

from consumers.config import events, kafka_connection, pipeline_spec, profiles
from consumers.config.kafka_connection import KafkaConnection
from consumers.kafka_clients import acls
from measure.sizing import SizingInput, size

log = logging.getLogger(__name__)


class ProvisioningError(ValueError):
    """A request the cluster cannot satisfy; nothing was changed."""


@dataclass
class TopicReport:
    """What provisioning did to one topic."""

    topic: str
    action: str  # created | grown | unchanged
    partitions: int
    replication_factor: int
    warnings: list[str] = field(default_factory=list)


def _admin(cluster: KafkaConnection | AdminClient) -> AdminClient:
    return cluster.admin() if isinstance(cluster, KafkaConnection) else cluster


def provision(cluster: KafkaConnection | AdminClient, topics: list[str], partitions: int,
              profile: str = "durability", replication_factor: int | None = None,
              timeout_s: float = 30.0) -> list[TopicReport]:
    """Create or grow `topics` to `partitions` with the profile's topic settings.

    `cluster` is a connection or an AdminClient (Airflow passes the one its Kafka hook built).
    """
    settings = profiles.get(profile).topic
    rf = settings.replication_factor if replication_factor is None else replication_factor
    admin = _admin(cluster)
    brokers = len(admin.list_topics(timeout=timeout_s).brokers)
    _check_request(partitions, rf, settings.min_insync_replicas, brokers)
    min_isr = min(settings.min_insync_replicas, rf)
    configs = {**settings.configs(), "min.insync.replicas": str(min_isr)}

    existing = admin.list_topics(timeout=timeout_s).topics
    reports = []
    to_create = [t for t in topics if t not in existing]
    if to_create:
        futures = admin.create_topics([NewTopic(t, partitions, rf, config=configs) for t in to_create])
        for topic, future in futures.items():
            future.result(timeout_s)
            reports.append(TopicReport(topic, "created", partitions, rf))
    for topic in (t for t in topics if t in existing):
        reports.append(_reconcile(admin, topic, existing[topic], partitions, configs, timeout_s))
    return reports


def delete(cluster: KafkaConnection | AdminClient, topics: list[str], timeout_s: float = 60.0) -> list[str]:
    """Delete the topics of a finished run (those that exist); return the ones deleted.

    A broker carrying the partitions of every past run gets slower for the current one, so
    benchmarks remove what they created once their figures are computed.
    """
    admin = _admin(cluster)
    existing = admin.list_topics(timeout=timeout_s).topics
    doomed = [t for t in topics if t in existing]
    if doomed:
        for future in admin.delete_topics(doomed).values():
            future.result(timeout_s)
    return doomed


def configure_share_group(cluster: KafkaConnection | AdminClient, group_id: str, time_scale: float,
                          timeout_s: float = 30.0) -> None:
    """Set a share group's configs (`profiles.share_group_configs`); idempotent. It must precede
    the group's first fetch: a share partition starts where the group config says when it is
    first fetched from, and stays there."""
    resource = ConfigResource(ConfigResource.Type.GROUP, group_id, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
        for k, v in profiles.share_group_configs(time_scale).items()])
    admin = _admin(cluster)  # held until the result: a collected client cancels its requests
    admin.incremental_alter_configs([resource])[resource].result(timeout_s)


def _check_request(partitions: int, rf: int, min_isr: int, brokers: int) -> None:
    if partitions < 1:
        raise ProvisioningError(f"partitions must be at least 1, got {partitions}")
    if rf < 1:
        raise ProvisioningError(f"replication factor must be at least 1, got {rf}")
    if rf > brokers:
        raise ProvisioningError(f"replication factor {rf} exceeds the {brokers} broker(s) of the "
                                "cluster; lower it or add brokers")
    if min(min_isr, rf) > rf:
        raise ProvisioningError(f"min.insync.replicas {min_isr} exceeds replication factor {rf}")


def _reconcile(admin: AdminClient, topic: str, meta, partitions: int, configs: dict[str, str],
               timeout_s: float) -> TopicReport:
    current = len(meta.partitions)
    rf = len(next(iter(meta.partitions.values())).replicas)
    report = TopicReport(topic, "unchanged", current, rf)
    if partitions < current:
        report.warnings.append(f"{topic} has {current} partitions; asked for {partitions}: "
                               "partitions are never shrunk")
    elif partitions > current:
        admin.create_partitions([NewPartitions(topic, partitions)])[topic].result(timeout_s)
        report.action, report.partitions = "grown", partitions
        report.warnings.append(f"{topic} grown {current} -> {partitions}: keys now hash to other "
                               "partitions, so per-key ordering breaks across the change")
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    admin.incremental_alter_configs([resource])[resource].result(timeout_s)
    for warning in report.warnings:
        log.warning(warning)
    return report


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeline", default=pipeline_spec.REFERENCE,
                   help="the pipeline spec whose topics to create: a name in pipelines/ or a path")
    p.add_argument("--prefix", required=True, help="pipeline topic prefix")
    p.add_argument("--profile", choices=list(profiles.PROFILES), default="durability")
    p.add_argument("--partitions", type=int, help="partitions (or size them from the rates below)")
    p.add_argument("--replication-factor", type=int, help="default: the profile's")
    p.add_argument("--target-rps", type=float)
    p.add_argument("--produce-rps-per-partition", type=float)
    p.add_argument("--consume-rps-per-partition", type=float)
    kafka_connection.add_argument(p)
    args = p.parse_args()
    partitions = args.partitions
    if partitions is None:
        if None in (args.target_rps, args.produce_rps_per_partition, args.consume_rps_per_partition):
            p.error("give --partitions, or --target-rps with both per-partition rates")
        sizing = size(SizingInput(args.target_rps, args.produce_rps_per_partition,
                                  args.consume_rps_per_partition))
        partitions = sizing["partitions"]
        print("\n".join(sizing["reasoning"]))
    try:
        access = kafka_connection.from_args(args, p)
        topics = events.Topics(args.prefix, pipeline_spec.load(args.pipeline))
        admin = access.default.admin()
        reports = provision(admin, topics.all(), partitions, args.profile, args.replication_factor)
        acls.grant(admin, topics, access)
    except (ProvisioningError, pipeline_spec.SpecError) as exc:
        raise SystemExit(f"error: {exc}") from None
    for r in reports:
        print(f"{r.topic}: {r.action}, {r.partitions} partitions, RF {r.replication_factor}")


if __name__ == "__main__":
    main()
