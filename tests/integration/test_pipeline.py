"""The pipelines against the real broker, PostgreSQL and the AI stand-in over HTTP: the reference
pipeline's behaviours one by one, and the text moderation pipeline's fan-out and join."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer

from consumers.config import events
from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.config.kafka_connection import KafkaConnection
from consumers.runs.pipeline_run import running_pipeline
from tests.integration.pipeline_fixtures import (
    REBALANCE_TIME_SCALE,
    TIME_SCALE,
    AIService,
    ai_service,
    query,
    scalar,
)
from tests.stack import Stack

BURST = 240


@pytest.fixture(scope="module")
def ai() -> Iterator[AIService]:
    with ai_service() as service:
        yield service


@dataclass
class BurstRun:
    run_id: str
    counts: dict[str, int]
    ai_stats: dict
    load_started: float
    load_finished: float
    partitions: int
    generate_members: int
    generate_window: int


def run_burst(stack: Stack, ai: AIService, config: PipelineConfig, count: int,
              reject_share: float = 0.1) -> BurstRun:
    ai.reset()
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints) as pipeline:
        started = time.time()
        pipeline.send(count, reject_share=reject_share)
        counts = pipeline.wait_terminal(count, timeout_s=180)
        finished = time.time()
    return BurstRun(pipeline.run_id, counts, ai.stats(), started, finished, config.partitions,
                    config.stage("generate").members, config.stage("generate").window)


# generate's latency in the windowed run, at the stand-in's scale (0.8 s a call): its window of
# 16 fills once intake and check deliver 20 requests/s, which a loaded machine does too. At the
# spec's 3 s (60 ms) they had to deliver 130/s, and a CI run saw 7 in flight.
SLOW_GENERATE_S = 40.0


@pytest.fixture(scope="module")
def flow_run(stack: Stack) -> Iterator[BurstRun]:
    config = PipelineConfig(partitions=8, time_scale=REBALANCE_TIME_SCALE, replication_factor=1,
                            stages={"check": StageConfig("flow", members=1, window=16),
                                    "generate": StageConfig("flow", members=2, window=8)})
    with ai_service() as slow:
        slow.configure(generate={"latency_s": SLOW_GENERATE_S})
        yield run_burst(stack, slow, config, BURST)


def test_every_request_completes_both_stages_exactly_once(stack: Stack, flow_run: BurstRun) -> None:
    counts = flow_run.counts
    assert counts.get("completed", 0) + counts.get("rejected", 0) == BURST, counts
    assert counts.get("rejected", 0) > 0
    results = dict(query(stack.database_url, "SELECT stage, count(*) FROM stage_results "
                         "WHERE run_id = %s GROUP BY stage", flow_run.run_id))
    assert results == {"intake": BURST, "check": BURST, "generate": counts["completed"]}
    unnotified = scalar(stack.database_url, "SELECT count(*) FROM requests WHERE run_id = %s "
                        "AND notified_at IS NULL", flow_run.run_id)
    assert unnotified == 0


def test_attempts_account_for_every_ai_call(stack: Stack, flow_run: BurstRun) -> None:
    rows = dict(query(stack.database_url, "SELECT stage, count(*) FROM ai_attempts WHERE run_id = %s "
                      "AND outcome <> 'skipped_done' GROUP BY stage", flow_run.run_id))
    stats = flow_run.ai_stats
    for stage, endpoint in (("check", "check"), ("generate", "generate")):
        calls = stats[endpoint]
        assert rows[stage] == calls["served"] + calls["rejected_429"] + calls["errors_5xx"]
    duplicates = scalar(stack.database_url, "SELECT count(*) FROM (SELECT request_id, stage FROM "
                        "ai_attempts WHERE run_id = %s AND outcome = 'ok' GROUP BY 1, 2 "
                        "HAVING count(*) > 1) d", flow_run.run_id)
    assert duplicates == 0


def test_flow_never_exceeds_its_window_with_fewer_members_than_partitions(flow_run: BurstRun) -> None:
    window = flow_run.generate_members * flow_run.generate_window
    observed = flow_run.ai_stats["generate"]["max_in_flight"]
    assert flow_run.generate_members < flow_run.partitions
    assert observed <= window
    assert observed >= window // 2, "the window was never used: the test proves nothing"


def rebalances_during_load(stack: Stack, run: BurstRun, group_suffix: str) -> int:
    return scalar(stack.database_url, "SELECT count(*) FROM rebalance_events WHERE run_id = %s "
                  "AND group_id LIKE %s AND event IN ('revoke', 'lost', 'max_poll_exceeded') "
                  "AND at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
                  run.run_id, f"%{group_suffix}", run.load_started, run.load_finished)


def test_flow_has_no_rebalance_after_initial_assignment(stack: Stack, flow_run: BurstRun) -> None:
    assert rebalances_during_load(stack, flow_run, ".generate") == 0
    assert rebalances_during_load(stack, flow_run, ".check") == 0


def test_bounded_has_no_rebalance_after_initial_assignment(stack: Stack, ai: AIService) -> None:
    config = PipelineConfig(partitions=4, time_scale=REBALANCE_TIME_SCALE, replication_factor=1,
                            stages={"check": StageConfig("bounded", members=4, batch_size=2),
                                    "generate": StageConfig("bounded", members=4, batch_size=2)})
    run = run_burst(stack, ai, config, 120)
    assert run.counts.get("completed", 0) + run.counts.get("rejected", 0) == 120
    assert rebalances_during_load(stack, run, ".generate") == 0
    assert ai.stats()["generate"]["max_in_flight"] <= 4  # one request in flight per member


def test_baseline_long_batch_is_expelled_and_reconsumed(stack: Stack, ai: AIService) -> None:
    # 300 keyless events land on few partitions; 500-record batches at 60 ms per call outlast
    # max.poll.interval.ms (300 s x 0.02 = 6 s).
    config = PipelineConfig(partitions=2, time_scale=TIME_SCALE, replication_factor=1,
                            key_strategy="none", profile="latency",
                            stages={"check": StageConfig("flow", members=1, window=32),
                                    "generate": StageConfig("baseline", members=2)})
    run = run_burst(stack, ai, config, 300, reject_share=0.0)
    assert run.counts.get("completed", 0) == 300, run.counts
    events = dict(query(stack.database_url, "SELECT event, count(*) FROM rebalance_events WHERE "
                        "run_id = %s AND group_id LIKE '%%.generate' AND at > to_timestamp(%s) "
                        "GROUP BY event", run.run_id, run.load_started))
    assert events.get("max_poll_exceeded", 0) >= 1, events
    assert events.get("revoke", 0) + events.get("lost", 0) >= 1, events
    reconsumed = scalar(stack.database_url, "SELECT count(*) FROM (SELECT request_id FROM ai_attempts "
                        "WHERE run_id = %s AND stage = 'generate' GROUP BY request_id "
                        "HAVING count(*) > 1) r", run.run_id)
    assert reconsumed > 0
    results = scalar(stack.database_url, "SELECT count(*) FROM stage_results WHERE run_id = %s "
                     "AND stage = 'generate'", run.run_id)
    assert results == 300  # re-consumption never duplicates a result


def test_bad_input_is_dead_lettered_and_the_partition_moves_on(stack: Stack, ai: AIService) -> None:
    config = PipelineConfig(partitions=2, time_scale=TIME_SCALE, replication_factor=1)
    bad = {
        "malformed_json": b"{not json",
        "missing_field": b'{"request_id": "7f1c4a36-5a5c-4d8e-9a57-2f5f1b9c0d11"}',
        "wrong_type": b'{"request_id": 5, "run_id": "r", "style": "minimal", "description": "d", '
                      b'"produced_at": 1}',
        "oversize": b'{"pad": "' + b"x" * 70_000 + b'"}',
        "unknown_style": b'{"request_id": "7f1c4a36-5a5c-4d8e-9a57-2f5f1b9c0d12", "run_id": "r", '
                         b'"style": "baroque", "description": "d", "produced_at": 1}',
    }
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints) as pipeline:
        producer = pipeline.fleets["check"].producer
        for value in bad.values():
            producer.send(pipeline.topics.name("style"), value=value, partition=0).result(10)
        valid = pipeline.send(1)  # lands on either partition; partition 0 checked below
        for value in bad.values():
            producer.send(pipeline.topics.name("style"), value=value, partition=0).result(10)
        producer.send(pipeline.topics.name("style"), value=_style_for(valid.request_ids[0], pipeline.run_id),
                      partition=0).result(10)
        counts = pipeline.wait_terminal(1, timeout_s=60)
        dead = _read_dead_letters(stack.connection, pipeline.topics.dead_letter, 2 * len(bad))
    assert counts == {"completed": 1}
    assert sorted(h["reason"] for h in dead) == sorted(list(bad) * 2)
    style = pipeline.topics.name("style")
    assert all(h["source_topic"] == style and h["source_partition"] == "0" for h in dead)
    rows = query(stack.database_url, "SELECT split_part(reason, ':', 1), count(*) FROM dead_letters "
                 "WHERE run_id = %s GROUP BY 1", pipeline.run_id)
    assert dict(rows) == dict.fromkeys(bad, 2)


def _style_for(request_id: str, run_id: str) -> bytes:
    return events.encode({"request_id": request_id, "run_id": run_id, "style": "minimal",
                          "description": "slides again", "produced_at": time.time()})


def _read_dead_letters(kafka: KafkaConnection, topic: str, expected: int) -> list[dict[str, str]]:
    consumer = Consumer(kafka.client(**{"group.id": f"dlq-{topic}", "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    found: list[dict[str, str]] = []
    deadline = time.monotonic() + 30
    try:
        while len(found) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                found.append({k: v.decode() for k, v in msg.headers()})
    finally:
        consumer.close()
    return found


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.1)


def own_failures(database_url: str, run_id: str) -> dict[tuple[str, str], int]:
    """Per (request, stage), the failed tries the platform counted against the request."""
    return {(r, s): n for r, s, n in query(
        database_url, "SELECT request_id, stage, count(*) FILTER (WHERE own_failure) FROM ai_attempts "
        "WHERE run_id = %s GROUP BY 1, 2", run_id)}


def test_an_endpoint_down_for_everyone_is_waited_out_and_dead_letters_nothing(stack: Stack,
                                                                               ai: AIService) -> None:
    config = PipelineConfig(partitions=2, time_scale=TIME_SCALE, replication_factor=1, max_attempts=3,
                            backoff_base_s=0.05)
    ai.reset()
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints) as pipeline:
        ai.configure(endpoint="generate", error_rate=1.0)
        try:
            during = pipeline.send(5)
            wait_until(lambda: scalar(stack.database_url, "SELECT count(*) FROM endpoint_circuits WHERE "
                                      "run_id = %s AND stage = 'generate' AND state = 'open'",
                                      pipeline.run_id) > 0, 30, "the generate endpoint's circuit opened")
        finally:
            ai.configure(endpoint="generate", error_rate=0.0)
        pipeline.send(5)
        counts = pipeline.wait_terminal(10, timeout_s=60)
    assert counts == {"completed": 10}
    assert scalar(stack.database_url, "SELECT count(*) FROM dead_letters WHERE run_id = %s",
                  pipeline.run_id) == 0
    failed = query(stack.database_url, "SELECT DISTINCT request_id FROM ai_attempts WHERE run_id = %s "
                   "AND stage = 'generate' AND outcome = 'http_5xx'", pipeline.run_id)
    assert {r for (r,) in failed} <= set(during.request_ids) and failed  # the outage met them
    assert max(own_failures(stack.database_url, pipeline.run_id).values()) <= 3
    states = [s for (s,) in query(stack.database_url, "SELECT state FROM endpoint_circuits WHERE run_id = %s "
                                  "AND stage = 'generate' ORDER BY id", pipeline.run_id)]
    assert states[0] == "open" and states[-1] == "closed"
    stats = ai.stats()["generate"]
    assert stats["served"] == 10 and stats["duplicate_served"] == 0


def test_a_request_never_has_more_own_failures_than_its_tries(stack: Stack, ai: AIService) -> None:
    # 60 % of the generate calls fail (5xx, and hangs past the client's timeout) for everyone;
    # 429 bursts come from a rate limit beside them.
    config = PipelineConfig(partitions=4, time_scale=TIME_SCALE, replication_factor=1, max_attempts=3,
                            backoff_base_s=0.01)
    ai.reset()
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints) as pipeline:
        ai.configure(endpoint="generate", error_rate=0.45, hang_rate=0.15, hang_s=10.0,
                     rate_limit_rps=400.0, rate_burst=8)
        try:
            pipeline.send(150)
            counts = pipeline.wait_terminal(150, timeout_s=120)
        finally:
            ai.configure(endpoint="generate", error_rate=0.0, hang_rate=0.0, hang_s=30.0,
                         rate_limit_rps=None, rate_burst=1)
    own = own_failures(stack.database_url, pipeline.run_id)
    assert max(own.values()) <= 3
    letters = query(stack.database_url, "SELECT request_id, split_part(reason, ':', 1) FROM dead_letters "
                    "WHERE run_id = %s", pipeline.run_id)
    assert letters and counts.get("dead_lettered") == len(letters)  # some requests had their tries
    # A request is dead-lettered after exactly its 3 own failures, and completed with fewer.
    assert {reason for _, reason in letters} == {"ai_unavailable"}
    assert {own[r, "generate"] for r, _ in letters} == {3}
    dead = {r for r, _ in letters}
    assert all(n < 3 for (r, stage), n in own.items() if stage == "generate" and r not in dead)


def test_uuid_keys_reach_every_partition_and_no_keys_concentrate(stack: Stack, ai: AIService) -> None:
    config = PipelineConfig(partitions=16, time_scale=TIME_SCALE, replication_factor=1)
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints,
                          stages=()) as pipeline:
        keyed = pipeline.send(640, key_strategy="uuid").per_partition(16)
        keyless = pipeline.send(640, key_strategy="none").per_partition(16)
    mean = 640 / 16
    assert min(keyed) >= 15, keyed  # every partition gets a share of the burst
    assert sum(sorted(keyed)[-3:]) < 0.35 * 640, keyed
    # Sticky partitioning: whole batch windows land on one partition each.
    assert sum(sorted(keyless)[-3:]) >= 0.5 * 640, keyless
    assert max(keyless) >= 3 * mean, keyless


def test_graceful_shutdown_under_load_loses_and_duplicates_nothing(stack: Stack, ai: AIService) -> None:
    config = PipelineConfig(partitions=4, time_scale=TIME_SCALE, replication_factor=1,
                            stages={"check": StageConfig("flow", members=1, window=8),
                                    "generate": StageConfig("flow", members=1, window=4)})
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints) as pipeline:
        pipeline.send(200)
        wait_until(lambda: pipeline.settled() >= 10, 60, "the first requests done")  # under load
        run_id = pipeline.run_id
    interrupted = sum(pipeline.status_counts().get(s, 0) for s in ("completed", "rejected"))
    assert interrupted < 200, "the load finished before the shutdown: the test proves nothing"
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints,
                          run_id=run_id) as resumed:
        counts = resumed.wait_terminal(200, timeout_s=120)
    assert counts == {"completed": 200}
    duplicates = scalar(stack.database_url, "SELECT count(*) FROM (SELECT request_id, stage FROM "
                        "ai_attempts WHERE run_id = %s AND outcome = 'ok' GROUP BY 1, 2 "
                        "HAVING count(*) > 1) d", run_id)
    assert duplicates == 0


TEXTS = 160
# The models' calls last long enough here (summarize: 600 ms median, classify 400 ms) that whether
# the two run at once is decided by the pipeline's shape, not by how busy the machine is: at a
# tenth of the latencies, a busy machine's drift between the two stages' fleets left 52 of 125
# posts' calls overlapping.
TEXT_TIME_SCALE = 0.5


@pytest.fixture(scope="module")
def text_run(stack: Stack, ai: AIService) -> Iterator[tuple[str, dict[str, int], dict]]:
    """A burst through text_moderation: a share of posts blocked, the rest summarised and
    classified in parallel and joined."""
    # The two fan-out stages hold as many posts as their endpoints take (64): with the default
    # window of 16, the slower model's stage queued behind moderation's output while the other
    # kept up, and how far their calls drifted apart depended on the machine's speed (56 to 114
    # overlapping of 125 over eight runs), not on the routing this test is about.
    fan_out = StageConfig(window=64)
    config = PipelineConfig(pipeline="text_moderation", partitions=8, time_scale=TEXT_TIME_SCALE,
                            replication_factor=1).with_stages(summarize=fan_out, classify=fan_out)
    ai.reset()
    ai.configure(time_scale=TEXT_TIME_SCALE)
    try:
        with running_pipeline(config, stack.kafka, stack.database_url,
                              ai.endpoints_of("text_moderation")) as pipeline:
            pipeline.send(TEXTS, reject_share=0.2)
            counts = pipeline.wait_terminal(TEXTS, timeout_s=180)
        stats = ai.stats()
    finally:
        ai.configure(time_scale=TIME_SCALE)
    yield pipeline.run_id, counts, stats


def test_text_moderation_blocks_or_joins_both_answers_of_every_post(
        stack: Stack, text_run: tuple[str, dict[str, int], dict]) -> None:
    run_id, counts, _ = text_run
    assert counts.get("completed", 0) + counts.get("rejected", 0) == TEXTS, counts
    assert 0 < counts.get("rejected", 0) < TEXTS / 2, counts  # about a fifth are spam
    results = dict(query(stack.database_url, "SELECT stage, count(*) FROM stage_results "
                         "WHERE run_id = %s GROUP BY stage", run_id))
    allowed = counts["completed"]
    assert results == {"moderate": TEXTS, "summarize": allowed, "classify": allowed, "join": allowed}
    kept = query(stack.database_url, "SELECT fields->>'summary', fields->>'labels', fields->>'author' "
                 "FROM requests WHERE run_id = %s AND status = 'completed'", run_id)
    assert len(kept) == allowed
    assert all(summary.startswith("summary of ") and labels == "news,product" and author
               for summary, labels, author in kept)
    unnotified = scalar(stack.database_url, "SELECT count(*) FROM requests WHERE run_id = %s "
                        "AND notified_at IS NULL", run_id)
    assert unnotified == 0


def test_text_moderation_calls_each_model_once_per_post_and_the_two_in_parallel(
        stack: Stack, text_run: tuple[str, dict[str, int], dict]) -> None:
    run_id, counts, stats = text_run
    calls = dict(query(stack.database_url, "SELECT stage, count(*) FROM ai_attempts WHERE run_id = %s "
                       "AND outcome = 'ok' GROUP BY stage", run_id))
    assert calls == {"moderate": TEXTS, "summarize": counts["completed"], "classify": counts["completed"]}
    assert all(stats[name]["duplicate_served"] == 0 for name in ("moderate", "summarize", "classify"))
    assert stats["summarize"]["served"] == counts["completed"]
    # Fan-out: for most allowed posts the two calls overlap in time.
    overlapping = scalar(stack.database_url, """
        SELECT count(*) FROM ai_attempts s JOIN ai_attempts c USING (pipeline, request_id)
        WHERE s.run_id = %s AND s.stage = 'summarize' AND c.stage = 'classify'
          AND s.outcome = 'ok' AND c.outcome = 'ok'
          AND s.started_at < c.ended_at AND c.started_at < s.ended_at""", run_id)
    assert overlapping >= counts["completed"] // 2, (overlapping, counts)
