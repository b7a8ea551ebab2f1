"""Every call the AI service serves twice is one the platform counts as paid twice, against the
real broker, PostgreSQL and the stand-in over HTTP. On an endpoint whose tail runs eight times
its median, past the fixed latency its spec declares, and whose limit moves down and back up,
the learned timeout cuts no call; with hangs injected past any timeout, each abandoned try is
counted, in the duplicate calls and in the cost, as the service counts what it served twice."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from consumers.config import presets
from consumers.config.candidate import PipelineConfig
from consumers.runs.pipeline_run import running_pipeline
from consumers.runs.run_figures import REPEATED_CALLS_SQL, cost_figures, rows
from measure import figures
from tests.integration.pipeline_fixtures import AIService, ai_service
from tests.stack import Stack

# generate at a median of 1 s with a lognormal tail of sigma 0.9: p99 = exp(2.326 x 0.9) = 8.1 s,
# 8.1 times the median and past the fixed 3 s its spec declares (real-scale seconds).
HEAVY_TAIL = {"distribution": "lognormal", "latency_s": 1.0, "sigma": 0.9}
# the limit falls to an eighth while the stand-in holds more calls than that (so under what the
# fleet has in flight then, whatever its limiter had found by that time: at a quarter, a limiter
# that had just backed off to it once met no refusal), and comes back 35 s later (real scale)
MOVING_LIMIT = [[0, 8], [35, 64]]
# At 0.1 the client waits 5 s at most (the 3 s of generate's declared 30 floored), 50 s at real
# scale: a call past it is 3.9 standard deviations out on this tail.
TIME_SCALE = 0.1


@pytest.fixture(scope="module")
def ai() -> Iterator[AIService]:
    with ai_service(time_scale=TIME_SCALE) as service:
        yield service


def adaptive_config() -> PipelineConfig:
    return presets.build("flow-adaptive", presets.PresetParams(
        partitions=8, concurrency=64, time_scale=TIME_SCALE, flow_members=2))


def quiet_stats(ai: AIService, timeout_s: float = 30.0) -> dict:
    """The stand-in's counters once it has no call in flight: an abandoned try is served, and
    counted, when its hang ends."""
    deadline = time.monotonic() + timeout_s
    while (stats := ai.stats())["generate"]["in_flight"] or stats["check"]["in_flight"]:
        assert time.monotonic() < deadline, f"calls still in flight at the stand-in after {timeout_s} s"
        time.sleep(0.1)
    return stats


def paid_twice(database_url: str, run_id: str, completed: int, config: PipelineConfig
               ) -> tuple[int, int, int]:
    """The platform's duplicate AI calls, its cost's paid-twice and abandoned tries."""
    duplicates = figures.beyond_first(n for (n,) in rows(database_url, REPEATED_CALLS_SQL, {"run": run_id}))
    spent = cost_figures(database_url, run_id, completed, config.spec)
    return duplicates, spent["paid_twice"], spent["abandoned"]


REPEATED_TRIES_SQL = """
SELECT stage, outcome, round(extract(epoch FROM ended_at - started_at)::numeric, 2) FROM ai_attempts
WHERE run_id = %(run)s AND (request_id, stage) IN (
  SELECT request_id, stage FROM ai_attempts WHERE run_id = %(run)s GROUP BY 1, 2 HAVING count(*) > 1)
ORDER BY request_id, stage, id
"""


def wait_in_flight(ai: AIService, level: int, timeout_s: float = 120.0) -> None:
    """Until generate holds more than `level` calls at once: the burst has reached it (on a busy
    machine the members may take seconds to join and the first records to arrive)."""
    deadline = time.monotonic() + timeout_s
    while ai.stats()["generate"]["in_flight"] <= level:
        assert time.monotonic() < deadline, f"generate never held more than {level} calls"
        time.sleep(0.05)


def run(stack: Stack, ai: AIService, count: int, limit_schedule: list[list[int]] | None = None,
        **generate: object) -> tuple[dict, tuple[int, int, int]]:
    config = adaptive_config()
    ai.reset()
    with running_pipeline(config, stack.kafka, stack.database_url, ai.endpoints) as pipeline:
        ai.configure(endpoint="generate", limit_schedule=[], **generate)
        pipeline.send(count)
        if limit_schedule:
            wait_in_flight(ai, min(limit for _, limit in limit_schedule))
            ai.configure(endpoint="generate", limit_schedule=limit_schedule)  # its clock starts here
        counts = pipeline.wait_terminal(count, timeout_s=240)
    assert counts.get("completed", 0) + counts.get("rejected", 0) == count, counts
    stats = {**quiet_stats(ai), "run_id": pipeline.run_id}
    return stats, paid_twice(stack.database_url, pipeline.run_id, counts.get("completed", 0), config)


def test_a_tail_longer_than_declared_under_a_moving_limit_is_served_once(stack: Stack, ai: AIService) -> None:
    stats, (duplicates, twice, abandoned) = run(stack, ai, 800, **HEAVY_TAIL, limit_schedule=MOVING_LIMIT,
                                                hang_rate=0.0)
    generate = stats["generate"]
    assert generate["rejected_429"] > 0  # the limit fell under the fleet, which found it again
    assert generate["duplicate_served"] == stats["check"]["duplicate_served"] == 0, (
        rows(stack.database_url, REPEATED_TRIES_SQL, {"run": stats["run_id"]}))
    assert (duplicates, twice, abandoned) == (0, 0, 0)


def test_each_hang_past_the_timeout_is_counted_paid_twice_as_the_service_counts_it(
        stack: Stack, ai: AIService) -> None:
    # 5 % of generate's calls answered only after twice the most the client waits (10 s)
    config = adaptive_config()
    hang_s = 2 * config.ai_timeout("generate") / TIME_SCALE
    stats, (duplicates, twice, abandoned) = run(stack, ai, 300, distribution="fixed", latency_s=3.0,
                                                hang_rate=0.05, hang_s=hang_s)
    served_twice = stats["generate"]["duplicate_served"] + stats["check"]["duplicate_served"]
    assert stats["generate"]["hangs"] > 0
    assert duplicates == twice == served_twice
    # each hang abandoned at the client's timeout (the message: every repeated try, how long it took)
    assert abandoned == stats["generate"]["hangs"], rows(stack.database_url, REPEATED_TRIES_SQL,
                                                          {"run": stats["run_id"]})
