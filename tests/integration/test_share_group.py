"""The share mode against the real brokers, PostgreSQL and the AI stand-in: the share preset's AI
stages run as share-group members (KIP-932) through a whole pipeline run, a stage with more
members than partitions has every member at work, and a producer's capped batches let a burst
on one partition go to several members."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest
from confluent_kafka import AcknowledgeType, Message, ShareConsumer
from confluent_kafka.admin import ConfigResource, NewTopic

from consumers.config import presets, profiles
from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.kafka_clients import provisioning
from consumers.kafka_clients.producer import KeyedProducer
from consumers.runs.pipeline_run import running_pipeline
from consumers.runtime.share_member import ShareMember
from tests.integration.pipeline_fixtures import TIME_SCALE, AIService, ai_service, query, scalar
from tests.stack import Stack

# The tests of AI stages count the AI calls served against the requests completed: on a machine
# busy with other tests, a call outlasting its scaled timeout is tried again and served twice.
# They run alone, after the others; the producer's batches are no AI calls and run among them.
alone = pytest.mark.serial

BURST = 240
AI_STAGES = ("check", "generate")
PARAMS = presets.PresetParams(partitions=8, time_scale=TIME_SCALE, replication_factor=1)


@pytest.fixture(scope="module")
def ai() -> Iterator[AIService]:
    with ai_service() as service:
        yield service


@dataclass
class ShareRun:
    run_id: str
    config: PipelineConfig
    counts: dict[str, int]
    ai_stats: dict
    group_configs: dict[str, dict[str, str]]


def run_share(stack: Stack, ai: AIService, config: PipelineConfig, count: int, rate: float | None = None,
              reject_share: float = 0.1) -> ShareRun:
    """A burst (or a paced load) through the pipeline; the AI stages' share-group configs as the
    broker holds them."""
    ai.reset()
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints) as pipeline:
        # Guard: in-process fleets, so the members can be seen to be share-group members.
        assert all(isinstance(m, ShareMember) for s in AI_STAGES for m in pipeline.fleets[s].members)
        pipeline.send(count, rate=rate, reject_share=reject_share)
        counts = pipeline.wait_terminal(count, timeout_s=180)
    admin = stack.connection.admin()
    groups = {}
    for stage in AI_STAGES:
        resource = ConfigResource(ConfigResource.Type.GROUP, pipeline.topics.group_of(stage))
        described = admin.describe_configs([resource])[resource].result(30)
        groups[stage] = {name: described[name].value for name in profiles.share_group_configs(1.0)}
    return ShareRun(pipeline.run_id, config, counts, ai.stats(), groups)


@pytest.fixture(scope="module")
def preset_run(stack: Stack, ai: AIService) -> ShareRun:
    """The share preset at the stand-in's time scale, on fewer partitions than its members."""
    return run_share(stack, ai, presets.build("share", PARAMS), BURST)


@alone
def test_the_preset_runs_its_ai_stages_as_share_groups_with_flow_concurrency(preset_run: ShareRun) -> None:
    flow = presets.build("flow", PARAMS)
    for stage in AI_STAGES:
        share = preset_run.config.stage(stage)
        assert (share.mode, share.members, share.window) == ("share", 8, 8)
        assert share.ai_calls_at_once == flow.stage(stage).ai_calls_at_once == 64
        # Set by the members before they subscribed: the group starts at its earliest record.
        assert preset_run.group_configs[stage] == {"share.auto.offset.reset": "earliest",
                                                   "share.record.lock.duration.ms": "15000"}


@alone
def test_every_request_completes_once_and_none_is_lost(stack: Stack, preset_run: ShareRun) -> None:
    counts = preset_run.counts
    assert counts.get("completed", 0) + counts.get("rejected", 0) == BURST, counts
    assert counts.get("rejected", 0) > 0  # the check stage's routes both ran
    settled = scalar(stack.database_url, "SELECT count(*) FROM requests WHERE run_id = %s AND status IN "
                     "('completed', 'rejected')", preset_run.run_id)
    assert settled == BURST  # 0 lost
    results = dict(query(stack.database_url, "SELECT stage, count(*) FROM stage_results WHERE run_id = %s "
                         "GROUP BY stage", preset_run.run_id))
    assert results == {"intake": BURST, "check": BURST, "generate": counts["completed"]}
    assert scalar(stack.database_url, "SELECT count(*) FROM dead_letters WHERE run_id = %s",
                  preset_run.run_id) == 0


@alone
def test_the_ai_service_serves_every_request_once(stack: Stack, preset_run: ShareRun) -> None:
    stats = preset_run.ai_stats
    assert stats["check"]["served"] == BURST
    assert stats["generate"]["served"] == preset_run.counts["completed"]
    assert all(stats[endpoint]["duplicate_served"] == 0 for endpoint in AI_STAGES)
    duplicates = scalar(stack.database_url, "SELECT count(*) FROM (SELECT request_id, stage FROM ai_attempts "
                        "WHERE run_id = %s AND outcome = 'ok' GROUP BY 1, 2 HAVING count(*) > 1) d",
                        preset_run.run_id)
    assert duplicates == 0
    generate = preset_run.config.stage("generate")
    observed = stats["generate"]["max_in_flight"]
    assert observed <= generate.members * generate.window
    assert observed > generate.window, "never more calls at once than one member's window: proves nothing"


@alone
def test_more_members_than_partitions_all_receive_records(stack: Stack, ai: AIService) -> None:
    base = presets.build("share", replace(PARAMS, partitions=2))
    config = base.with_stages(**dict.fromkeys(AI_STAGES, StageConfig("share", members=4, window=4)))
    run = run_share(stack, ai, config, 200, rate=100.0, reject_share=0.0)
    assert run.counts == {"completed": 200}
    for stage in AI_STAGES:
        handled = dict(query(stack.database_url, "SELECT member, count(*) FROM ai_attempts WHERE run_id = %s "
                             "AND stage = %s AND outcome = 'ok' GROUP BY member", run.run_id, stage))
        assert sorted(handled) == [f"{stage}-{i}" for i in range(4)], handled  # 4 members, 2 partitions
        assert sum(handled.values()) == 200
    assert all(run.ai_stats[endpoint]["duplicate_served"] == 0 for endpoint in AI_STAGES)


def first_polls(stack: Stack, batch_records: int | None, window: int = 8, burst: int = 32) -> tuple[int, int]:
    """A burst of `burst` records on a one-partition topic, sent at once (a 200 ms linger) by a
    producer capped at `batch_records`; what the first poll of a share member asking for `window`
    records returns, and then what a second member's first poll returns while the first still
    holds its records."""
    topic = f"share-batches-{uuid.uuid4().hex[:8]}"
    admin = stack.connection.admin()
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = KeyedProducer(stack.connection, batch_records=batch_records, **{"linger.ms": 200})
    try:
        sent = [producer.send(topic, value=b"x" * 100) for _ in range(burst)]
        assert [f.result(30) for f in sent] == [(0, offset) for offset in range(burst)]
    finally:
        producer.close()
    group = f"{topic}-group"
    provisioning.configure_share_group(admin, group, 1.0)
    config = profiles.share_consumer_config("durability", stack.connection, group, window=window)
    members = [ShareConsumer(config) for _ in range(2)]
    try:
        polled: list[list[Message]] = []
        for member in members:
            member.subscribe([topic])
            deadline, batch = time.monotonic() + 20, []
            while not batch and time.monotonic() < deadline:
                batch = member.poll(0.5) or []
            polled.append(batch)
        for member, batch in zip(members, polled, strict=True):
            for msg in batch:
                member.acknowledge(msg, AcknowledgeType.ACCEPT)
        return len(polled[0]), len(polled[1])
    finally:
        for member in members:
            member.close()
        admin.delete_topics([topic])


def test_capped_producer_batches_spread_a_burst_over_the_members(stack: Stack) -> None:
    # Guard: uncapped, the broker hands the first member the whole batch and the second nothing.
    assert first_polls(stack, batch_records=None) == (32, 0)
    assert first_polls(stack, batch_records=8) == (8, 8)
