"""Partitions lent to a canary's fleet on live topics, against the real broker, PostgreSQL and
the AI stand-in: a lent partition is handled by the candidate only, handed back where it
stopped, and taken back from its group's commit when the candidate is killed; every request is
handled once, counted from the rows and the stand-in's own counters."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import replace

import pytest

from consumers.canary.loans import LoanStore
from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.kafka_clients.producer import KeyedProducer
from consumers.loadgen.source import send_requests
from consumers.runs.pipeline_run import Pipeline, running_pipeline
from consumers.runtime.fleet import Fleet
from consumers.runtime.fleet_process import FleetProcess
from consumers.runtime.fleet_settings import settings_for
from pipeline_ops.canary import HOLD_TIMEOUT_S
from tests.integration.kafka_helpers import wait_committed_to_end
from tests.integration.pipeline_fixtures import TIME_SCALE, AIService, ai_service, query, scalar
from tests.stack import Stack

REQUESTS = 240
RATE = 40.0  # requests a second: six seconds of live load
CONFIG = PipelineConfig(partitions=6, time_scale=TIME_SCALE, replication_factor=1,
                        stages={"check": StageConfig("flow", members=1, window=16),
                                "generate": StageConfig("flow", members=2, window=8)})


@pytest.fixture(scope="module")
def ai() -> Iterator[AIService]:
    with ai_service() as service:
        yield service


def until(what: Callable[[], bool], timeout_s: float, message: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def canary_row(database_url: str, run_id: str) -> tuple[int, int]:
    """A canary of the reference pipeline in the registry: (its id, the candidate's version)."""
    versions = [scalar(database_url, "INSERT INTO configurations (name, pipeline, config, note) VALUES "
                       "(%s, %s, %s, 'canary loans test') RETURNING version", name, CONFIG.pipeline,
                       CONFIG.to_json()) for name in ("canary-active", "canary-candidate")]
    canary = scalar(database_url, "INSERT INTO canaries (pipeline, run_id, active_version, "
                    "candidate_version, stages, plan) VALUES (%s, %s, %s, %s, %s, '{}') RETURNING id",
                    CONFIG.pipeline, run_id, versions[0], versions[1], ["generate"])
    return int(canary), int(versions[1])


def held(store: LoanStore, group: str, topic: str, partitions: int) -> bool:
    """The candidate holds every one of the `partitions` lent: the load starts after, so that the
    active fleet cannot have drained a lent partition before the hand-over. Waited for as long as
    a canary waits for it (a spawned fleet process starts slowly on a busy machine)."""
    loans = store.loans(group, topic)
    return len(loans) == partitions and all(loan.holder for loan in loans.values())


def live_load(stack: Stack, pipeline: Pipeline) -> threading.Thread:
    def send() -> None:
        producer = KeyedProducer(stack.connection, key_strategy="uuid")
        send_requests(producer, pipeline.topics, pipeline.run_id, REQUESTS, rate=RATE, progress=False)
        producer.close()

    thread = threading.Thread(target=send, name="live-load")
    thread.start()
    return thread


def handled_once(stack: Stack, ai: AIService, pipeline: Pipeline) -> None:
    """Every request generated exactly once, by the rows and by the stand-in."""
    topics = pipeline.topics
    left = wait_committed_to_end(stack.connection,
                                 {topics.source_of("generate"): topics.group_of("generate")}, 60)
    assert all(n == 0 for _, n in left.values()), left
    done = scalar(stack.database_url, "SELECT count(*) FROM stage_results WHERE run_id = %s "
                  "AND stage = 'generate'", pipeline.run_id)
    assert done == REQUESTS
    assert ai.stats()["generate"]["served"] == REQUESTS  # no call made twice


def candidate_partitions(database_url: str, run_id: str, version: int) -> dict[int, int]:
    return dict(query(database_url, "SELECT s.kafka_partition, count(*) FROM stage_results s "
                      "JOIN fleet_members f USING (run_id, member) WHERE s.run_id = %s "
                      "AND s.stage = 'generate' AND f.version = %s GROUP BY 1", run_id, version))


def test_lent_partitions_are_handled_by_the_candidate_and_handed_back(stack: Stack, ai: AIService) -> None:
    ai.reset()
    with (running_pipeline(CONFIG, stack.kafka, stack.database_url, ai.endpoints,
                           stages=("check", "generate")) as pipeline,
          closing(LoanStore(stack.database_url)) as store):
        canary, version = canary_row(stack.database_url, pipeline.run_id)
        topic, group = pipeline.topics.source_of("generate"), pipeline.topics.group_of("generate")
        settings = settings_for(CONFIG, "generate", pipeline.run_id, pipeline.topics, stack.kafka,
                                stack.database_url, ai.endpoints)
        with Fleet(replace(settings, instance="canary", version=version, canary=canary)).running():
            store.lend(group, topic, [0, 1], canary)
            until(lambda: held(store, group, topic, 2), HOLD_TIMEOUT_S,
                  "the lent partitions were never held by the candidate")
            load = live_load(stack, pipeline)
            until(lambda: len(candidate_partitions(stack.database_url, pipeline.run_id, version)) == 2, 30,
                  "the candidate handled nothing on one of its partitions")
            store.recall(group, topic, canary)
            until(lambda: not store.loans(group, topic), 30, "the partitions were never taken back")
            load.join()
            handled_once(stack, ai, pipeline)
    assert set(candidate_partitions(stack.database_url, pipeline.run_id, version)) == {0, 1}


def test_a_partition_lent_before_its_candidate_is_up_waits_for_it_past_the_lease(
        stack: Stack, ai: AIService) -> None:
    """A candidate whose fleet starts after one lease from the hand-over (a slow start under a
    supervisor) still gets the partition: a loan nobody has held does not lapse."""
    ai.reset()
    with (running_pipeline(CONFIG, stack.kafka, stack.database_url, ai.endpoints,
                           stages=("check", "generate")) as pipeline,
          closing(LoanStore(stack.database_url)) as store):
        canary, version = canary_row(stack.database_url, pipeline.run_id)
        topic, group = pipeline.topics.source_of("generate"), pipeline.topics.group_of("generate")
        store.lend(group, topic, [2], canary)
        until(lambda: bool(query(stack.database_url, "SELECT FROM partition_loans WHERE group_id = %s "
                                 "AND topic = %s AND state = 'lent' AND lease_until < now()", group, topic)),
              60, "the partition was never handed over, or its lease never ran out")
        settings = settings_for(CONFIG, "generate", pipeline.run_id, pipeline.topics, stack.kafka,
                                stack.database_url, ai.endpoints)
        with Fleet(replace(settings, instance="late-canary", version=version, canary=canary)).running():
            until(lambda: held(store, group, topic, 1), HOLD_TIMEOUT_S,
                  "the partition lent before the candidate was up was never held by it")
            store.recall(group, topic, canary)
            until(lambda: not store.loans(group, topic), 30, "the partition was never taken back")


def test_a_killed_candidates_partitions_are_taken_back_from_its_commit(stack: Stack, ai: AIService) -> None:
    ai.reset()
    with (running_pipeline(CONFIG, stack.kafka, stack.database_url, ai.endpoints,
                           stages=("check", "generate")) as pipeline,
          closing(LoanStore(stack.database_url)) as store):
        canary, version = canary_row(stack.database_url, pipeline.run_id)
        topic, group = pipeline.topics.source_of("generate"), pipeline.topics.group_of("generate")
        settings = settings_for(CONFIG, "generate", pipeline.run_id, pipeline.topics, stack.kafka,
                                stack.database_url, ai.endpoints)
        candidate = FleetProcess(replace(settings, instance=f"canary-{uuid.uuid4().hex[:4]}", version=version,
                                         canary=canary))
        with candidate.running():
            candidate.wait_assigned()  # its process up (or the error it died of): the loan timed apart
            store.lend(group, topic, [3], canary)
            until(lambda: held(store, group, topic, 1), HOLD_TIMEOUT_S,
                  "the lent partition was never held by the candidate")
            load = live_load(stack, pipeline)  # from here on partition 3's records are the candidate's
            until(lambda: candidate_partitions(stack.database_url, pipeline.run_id, version), 30,
                  "the candidate handled nothing")
            candidate.kill()
            killed = time.monotonic()
            until(lambda: not store.loans(group, topic), 30,
                  "the killed candidate's partition was never taken back")
            taken_back_s = time.monotonic() - killed
            load.join()
            handled_once_but_for(stack, ai, pipeline)
    assert taken_back_s < 30


def handled_once_but_for(stack: Stack, ai: AIService, pipeline: Pipeline) -> None:
    """Every request generated; AI calls made twice no more than the stand-in counts and no more
    than the killed member had in flight (its window)."""
    topics = pipeline.topics
    left = wait_committed_to_end(stack.connection,
                                 {topics.source_of("generate"): topics.group_of("generate")}, 60)
    assert all(n == 0 for _, n in left.values()), left
    done = scalar(stack.database_url, "SELECT count(*) FROM stage_results WHERE run_id = %s "
                  "AND stage = 'generate'", pipeline.run_id)
    assert done == REQUESTS
    served = ai.stats()["generate"]
    twice = served["served"] - REQUESTS
    assert 0 <= twice <= CONFIG.stage("generate").window * CONFIG.stage("generate").members
