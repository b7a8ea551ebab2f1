"""The Kafka configuration profiles: the one place that says how topics and clients are tuned.

The four profiles follow the Kafka optimisation theorem: every flow trades throughput against
latency and durability against availability. Topic settings (replication, min ISR, retention,
compression) and client settings (batching, acks, fetch sizes, timeouts) come from here;
provisioning, producers, consumers, DAGs and benchmarks read them and never restate them.

Timeouts are given at real scale; `scaled()` shrinks the consumer-group clocks with the
experiment's time-scale factor, so a run at 0.1x keeps the same ratios between AI latency and
`max.poll.interval.ms` as a run at 1x. A share group's record lock shrinks with them, as far as
the broker lets it (`group.share.min.record.lock.duration.ms`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from consumers.config.kafka_connection import KafkaConnection

GROUP_MODES = ("baseline", "bounded", "flow")  # members of a consumer group
# Modes whose outputs can be exactly once: a share group has no offsets to put in a transaction
# (KIP-932), and a baseline member is the reference's at-least-once client as it is.
TRANSACTIONAL_MODES = ("flow", "bounded")
CONSUMER_MODES = (*GROUP_MODES, "share")  # share: members of a share group (KIP-932)
GROUP_PROTOCOLS = ("classic", "consumer")


@dataclass(frozen=True)
class TopicSettings:
    """Per-topic settings chosen by a profile."""

    replication_factor: int
    min_insync_replicas: int
    retention_ms: int = 7 * 24 * 3600 * 1000
    compression_type: str = "producer"
    unclean_leader_election: bool = False

    def configs(self) -> dict[str, str]:
        """The topic-level configs for the AdminClient."""
        return {
            "min.insync.replicas": str(self.min_insync_replicas),
            "retention.ms": str(self.retention_ms),
            "compression.type": self.compression_type,
            "unclean.leader.election.enable": str(self.unclean_leader_election).lower(),
        }


@dataclass(frozen=True)
class Profile:
    """A named trade-off: topic settings plus producer and consumer client settings."""

    name: str
    summary: str
    topic: TopicSettings
    producer: dict[str, Any] = field(default_factory=dict)
    consumer: dict[str, Any] = field(default_factory=dict)


_DURABLE_PRODUCER = {"acks": "all", "enable.idempotence": True}

PROFILES: dict[str, Profile] = {
    "throughput": Profile(
        "throughput",
        "large batches, compression and fewer round trips; RF=3/min ISR=2 kept",
        TopicSettings(replication_factor=3, min_insync_replicas=2),
        producer={**_DURABLE_PRODUCER, "linger.ms": 20, "batch.size": 262144,
                  "compression.type": "lz4"},
        consumer={"fetch.min.bytes": 65536, "fetch.wait.max.ms": 100},
    ),
    "latency": Profile(
        "latency",
        "the clients' own defaults: records sent after at most 5 ms, no compression",
        TopicSettings(replication_factor=3, min_insync_replicas=2),
        # linger.ms 5 is the client default; 0 would also switch off sticky partitioning of
        # keyless records (sticky.partitioning.linger.ms defaults to 2 x linger.ms).
        producer={**_DURABLE_PRODUCER, "linger.ms": 5, "compression.type": "none"},
        consumer={"fetch.min.bytes": 1, "fetch.wait.max.ms": 10},
    ),
    "durability": Profile(
        "durability",
        "the production default: RF=3, min ISR=2, acks=all, idempotence, no unclean election",
        TopicSettings(replication_factor=3, min_insync_replicas=2),
        # A millisecond's linger, not 5: a stage sends at its AI's pace, so a batch waited its
        # whole linger for records that never came, on each of a request's three hops; with no
        # linger at all `durable` lost capacity (docs/design.md#durability-lingers-a-millisecond).
        # Keyless records stay sticky as before (10 ms per partition, twice the old linger).
        producer={**_DURABLE_PRODUCER, "linger.ms": 1, "sticky.partitioning.linger.ms": 10,
                  "compression.type": "lz4"},
        consumer={"fetch.min.bytes": 1, "fetch.wait.max.ms": 100},
    ),
    "availability": Profile(
        "availability",
        "keeps producing with one replica left: min ISR=1, acks=1, longer client timeouts",
        TopicSettings(replication_factor=3, min_insync_replicas=1, unclean_leader_election=True),
        producer={"acks": 1, "enable.idempotence": False, "linger.ms": 5,
                  "compression.type": "lz4", "message.timeout.ms": 600000},
        consumer={"fetch.min.bytes": 1, "fetch.wait.max.ms": 100},
    ),
}

# Consumer-group clocks at real scale (the Java/librdkafka defaults).
MAX_POLL_INTERVAL_MS = 300_000
SESSION_TIMEOUT_MS = 45_000
HEARTBEAT_INTERVAL_MS = 3_000
# How long a member's open transaction may last before the coordinator aborts it (exactly-once
# outputs, `consumers.runtime.outbox`): a transaction spans one commit interval's outputs, so seconds are
# plenty, and a member that died mid-transaction and is not restarted (a restart fences it at
# once) holds `read_committed` readers of its outputs back no longer than this.
TRANSACTION_TIMEOUT_MS = 10_000
# Share groups: the broker's defaults (`group.share.*`). The delivery count limit is a broker
# setting only, not a group one; a group's record lock must stay within the broker's bounds.
SHARE_RECORD_LOCK_MS = 30_000
SHARE_MIN_RECORD_LOCK_MS = 15_000
SHARE_MAX_RECORD_LOCK_MS = 60_000
SHARE_DELIVERY_COUNT_LIMIT = 5


def get(name: str) -> Profile:
    """The profile called `name`, or a clear error listing the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}") from None


def scaled(ms: int, time_scale: float, floor_ms: int) -> int:
    """A real-scale duration shrunk by the time-scale factor, never below `floor_ms`."""
    return max(floor_ms, round(ms * time_scale))


def producer_config(profile: str, kafka: KafkaConnection, *, partitioner: str = "murmur2_random",
                    batch_records: int | None = None, **overrides: Any) -> dict[str, Any]:
    """librdkafka producer settings for a profile; `murmur2_random` places keys as Java does.

    `batch_records` caps the records of one batch, for a producer feeding a share group: the
    broker acquires whole batches for a share member (the pinned client cannot ask for
    `share.acquire.mode=record_limit`), so a member asking for 8 records was handed all 32 of a
    batch, and another member found nothing until they were done
    (tests/integration/test_share_group.py). The cap removes that case, not a burst's usual
    tail (docs/design.md#a-share-stages-producers-cap-their-batches).
    """
    if batch_records is not None:
        overrides = {"batch.num.messages": batch_records, **overrides}
    return kafka.client(partitioner=partitioner, **{**get(profile).producer, **overrides})


def consumer_config(profile: str, kafka: KafkaConnection, group_id: str, *, mode: str,
                    time_scale: float = 1.0, group_protocol: str = "classic",
                    **overrides: Any) -> dict[str, Any]:
    """librdkafka consumer settings for a profile and consumer mode.

    `baseline` keeps the client's own fetch settings (that is what it measures); every mode
    commits explicitly after processing. With `group.protocol=consumer` (KIP-848) the broker
    owns session timeout and assignment, so those client settings are left out.
    """
    if mode not in GROUP_MODES:
        raise ValueError(f"unknown consumer-group mode {mode!r}; choose one of {', '.join(GROUP_MODES)} "
                         "(a share member's settings come from share_consumer_config)")
    if group_protocol not in GROUP_PROTOCOLS:
        raise ValueError(f"unknown group protocol {group_protocol!r}; choose one of {GROUP_PROTOCOLS}")
    config: dict[str, Any] = kafka.client(**{
        "group.id": group_id,
        "group.protocol": group_protocol,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # the outputs of a stage's aborted transactions are never seen (librdkafka's default,
        # said here because Java's is the opposite)
        "isolation.level": "read_committed",
        "max.poll.interval.ms": scaled(MAX_POLL_INTERVAL_MS, time_scale, 1000),
    })
    if group_protocol == "classic":
        config["session.timeout.ms"] = scaled(SESSION_TIMEOUT_MS, time_scale, 1000)
        config["heartbeat.interval.ms"] = scaled(HEARTBEAT_INTERVAL_MS, time_scale, 100)
        config["partition.assignment.strategy"] = "cooperative-sticky" if mode == "flow" else "range"
    if mode != "baseline":
        config.update(get(profile).consumer)
    if mode == "flow":
        # Small prefetch: whatever librdkafka holds when a partition is paused is discarded
        # and fetched again, so keep that amount small next to the application's own buffer.
        config.update({"queued.max.messages.kbytes": 256, "fetch.max.bytes": 1048576,
                       "max.partition.fetch.bytes": 65536})
    config.update(overrides)
    return config


def share_record_lock_ms(time_scale: float) -> int:
    """A share group's record lock at this time scale: the broker default shrunk like the other
    group clocks, within the bounds the broker accepts for a group."""
    return min(SHARE_MAX_RECORD_LOCK_MS, scaled(SHARE_RECORD_LOCK_MS, time_scale, SHARE_MIN_RECORD_LOCK_MS))


def share_group_configs(time_scale: float) -> dict[str, str]:
    """The configs a share group needs before its first member fetches: start at the earliest
    record (the default, latest, skips whatever was produced before), and the record lock."""
    return {"share.auto.offset.reset": "earliest",
            "share.record.lock.duration.ms": str(share_record_lock_ms(time_scale))}


def share_consumer_config(profile: str, kafka: KafkaConnection, group_id: str, *, window: int,
                          time_scale: float = 1.0, **overrides: Any) -> dict[str, Any]:
    """librdkafka share-consumer settings: explicit acknowledgement (a record is accepted only
    once handled) and `window` records per poll, the member's share of the AI concurrency.

    The lock is the group's (`share_group_configs`), not the client's. `max.poll.interval.ms` is
    at least twice the lock: a batch that outlasts its lock costs its records a redelivery, not
    the member its place in the group.
    """
    lock_ms = share_record_lock_ms(time_scale)
    return kafka.client(**{
        "group.id": group_id,
        "share.acknowledgement.mode": "explicit",
        "max.poll.records": window,
        "max.poll.interval.ms": max(scaled(MAX_POLL_INTERVAL_MS, time_scale, 1000), 2 * lock_ms),
        **get(profile).consumer,
        **overrides,
    })


def transactional_id(group_id: str, member: str) -> str:
    """A member's `transactional.id`, which the ACLs grant by its group's prefix: stable across
    restarts of the same member, so a restarted member fences its predecessor."""
    return f"{group_id}.{member}"
