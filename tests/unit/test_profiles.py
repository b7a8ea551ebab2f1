"""Profiles drive client settings; retry backoff and key strategies behave as documented."""

from __future__ import annotations

import random

import pytest

from consumers.ai.client import RetryPolicy
from consumers.config import presets, profiles
from consumers.config.kafka_connection import KafkaConnection
from consumers.kafka_clients.producer import key_for

B = KafkaConnection.plain("b:9092")


def test_time_scale_shrinks_group_clocks() -> None:
    config = profiles.consumer_config("durability", B, "g", mode="bounded", time_scale=0.1)
    assert config["max.poll.interval.ms"] == 30_000
    assert config["session.timeout.ms"] == 4_500
    assert config["enable.auto.commit"] is False


def test_kip848_leaves_out_client_side_group_settings() -> None:
    config = profiles.consumer_config("durability", B, "g", mode="flow", group_protocol="consumer")
    assert config["group.protocol"] == "consumer"
    assert "session.timeout.ms" not in config
    assert "partition.assignment.strategy" not in config


def test_baseline_keeps_client_fetch_defaults() -> None:
    baseline = profiles.consumer_config("throughput", B, "g", mode="baseline")
    bounded = profiles.consumer_config("throughput", B, "g", mode="bounded")
    assert "fetch.min.bytes" not in baseline
    assert bounded["fetch.min.bytes"] == 65536


@pytest.mark.parametrize("bad", [{"profile": "fastest"}, {"mode": "greedy"}])
def test_unknown_names_are_refused(bad: dict) -> None:
    args = {"profile": "durability", "mode": "flow", **bad}
    with pytest.raises(ValueError, match="choose one of"):
        profiles.consumer_config(args["profile"], B, "g", mode=args["mode"])


def test_the_connection_reaches_every_client_and_the_profile_wins_on_client_settings() -> None:
    secured = KafkaConnection({"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL",
                               "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "check",
                               "sasl.password": "pw", "ssl.ca.location": "/ca.pem"})
    consumer = profiles.consumer_config("durability", secured, "g", mode="flow")
    producer = profiles.producer_config("durability", secured, acks=1)
    for config in (consumer, producer):
        assert {k: config[k] for k in secured.settings} == dict(secured.settings)
    assert consumer["group.id"] == "g" and consumer["enable.auto.commit"] is False
    assert producer["acks"] == 1 and producer["partitioner"] == "murmur2_random"


def test_production_default_is_durable() -> None:
    durable = profiles.get("durability")
    assert (durable.topic.replication_factor, durable.topic.min_insync_replicas) == (3, 2)
    assert durable.producer["acks"] == "all" and durable.producer["enable.idempotence"] is True


def test_backoff_honours_retry_after_and_caps() -> None:
    policy = RetryPolicy(max_attempts=5, backoff_base_s=0.1, backoff_max_s=0.4)
    rng = random.Random(1)
    assert all(policy.backoff(a, None, rng) <= 0.4 for a in range(1, 10))
    assert policy.backoff(1, 2.5, rng) == 2.5


def test_key_strategies() -> None:
    assert key_for("none", {}) is None
    assert len(key_for("uuid", {})) == 16
    assert key_for("field:user_id", {"user_id": "u1"}) == b"u1"
    with pytest.raises(ValueError):
        key_for("random", {})




@pytest.mark.parametrize(("preset", "expected"), [
    ("flow-exactly-once", True), ("flow", False), ("tuned", False), ("baseline", False), ("share", False)])
def test_which_presets_are_exactly_once(preset: str, expected: bool) -> None:
    assert presets.build(preset, presets.PresetParams(pipeline="genai_image")).exactly_once is expected
