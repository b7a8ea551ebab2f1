"""The highest steady request rate a deployed pipeline sustains: its max sustainable rate.

Steady-rate steps, as OpenMessaging Benchmark and Theodolite measure: a step sends requests at
one rate for `step_s` seconds (under a run id of its own, on the deployment's topics and
fleets) while the pipeline's consumer lag is sampled, then waits until each request settled.
A step is sustained when the lag stays bounded -- its trend over the step's second half
(measure.figures.lag_trend) is at most `lag_growth` x the rate: the consumers keep up -- and
the end-to-end p99 of its requests (measure.figures, from produce) is within the objective,
with nothing lost. The search starts just below the AI capacity measured by a calibration
burst, steps up (x1.25) or down (x0.8) until one rate holds and a higher one fails, then
bisects until the bracket is narrower than `precision` x its upper end or `max_steps` steps
ran. The result is the highest sustained rate (None when no step held).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from consumers.config.events import Topics
from consumers.config.kafka_connection import KafkaConnection
from consumers.runs.pipeline_run import Pipeline
from consumers.runs.run_figures import standard_figures
from measure import figures

UP, DOWN = 1.25, 0.8


@dataclass(frozen=True)
class Objective:
    """When a step counts as sustained, and how long the search may take."""

    p99_s: float  # end-to-end p99 objective, wall-clock seconds
    lag_growth: float = 0.05  # largest lag trend, as a share of the rate
    step_s: float = 20.0
    precision: float = 0.03
    max_steps: int = 8

    def __post_init__(self) -> None:
        if self.p99_s <= 0 or self.step_s <= 0:
            raise ValueError("the latency objective and the step length must be positive")
        if not 0 <= self.lag_growth < 1 or not 0 < self.precision < 1:
            raise ValueError("lag_growth must be in [0, 1) and precision in (0, 1)")
        if self.max_steps < 2:
            raise ValueError("a search needs at least 2 steps: one that holds and one that fails")


@dataclass(frozen=True)
class Step:
    rate: float
    sustained: bool
    lag_trend: float  # records/s over the step's second half
    p99_s: float | None
    figures: dict[str, Any] = field(default_factory=dict)  # the step's standard figures
    lag: list[tuple[float, int]] = field(default_factory=list)  # (s since the step started, lag)

    def summary(self) -> dict[str, Any]:
        """The step without its samples, for logs and the registry."""
        keep = ("steady_throughput_rps", "capacity_rps", "utilization", "lost")
        return {**{k: v for k, v in asdict(self).items() if k not in ("figures", "lag")},
                "lag_max": max((lag for _, lag in self.lag), default=None),
                **{k: self.figures.get(k) for k in keep}}


def sustained(rate: float, trend: float, p99_s: float | None, lost: int, objective: Objective) -> bool:
    keeps_up = trend <= objective.lag_growth * rate
    return lost == 0 and keeps_up and p99_s is not None and p99_s <= objective.p99_s


def search(measure: Callable[[float], Step], start: float,
           objective: Objective) -> tuple[float | None, list[Step]]:
    """Bracket then bisect the highest sustained rate (see the module docstring)."""
    steps: list[Step] = []
    held: float | None = None
    failed: float | None = None
    rate = start
    while len(steps) < objective.max_steps:
        step = measure(rate)
        steps.append(step)
        if step.sustained:
            held = rate if held is None else max(held, rate)
        else:
            failed = rate if failed is None else min(failed, rate)
        if held is None:
            rate *= DOWN
        elif failed is None:
            rate *= UP
        elif failed - held <= objective.precision * failed:
            break
        else:
            rate = (held + failed) / 2
    return held, steps


def group_lag(consumer: Consumer, topic: str) -> int:
    """Records of `topic` past the committed offsets of `consumer`'s group, read from the brokers."""
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    total = 0
    for tp in consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
        total += figures.consumer_lag(low, high, tp.offset)
    return total


class LagSampler:
    """Samples the pipeline's consumer lag (every stage's group) in a thread while it is open."""

    def __init__(self, kafka: KafkaConnection, topics: Topics, every_s: float = 0.5) -> None:
        self.topics, self.every_s = topics, every_s
        self.consumers = {stage: Consumer(kafka.client(**{"enable.auto.commit": False,
                                                          "group.id": topics.group_of(stage)}))
                          for stage in topics.spec.stages}
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-sampler", daemon=True)

    def lag(self) -> int:
        return sum(group_lag(consumer, self.topics.source_of(stage))
                   for stage, consumer in self.consumers.items())

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), self.lag()))
            self._stop.wait(self.every_s)

    def __enter__(self) -> LagSampler:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        for consumer in self.consumers.values():
            consumer.close()


def run_step(pipeline: Pipeline, run_id: str, rate: float, objective: Objective, ai_limit: int,
             timeout_s: float) -> Step:
    """One steady-rate step through the deployment (see the module docstring)."""
    run = replace(pipeline, run_id=run_id)
    count = max(1, round(rate * objective.step_s))
    with LagSampler(pipeline.kafka.default, pipeline.topics) as sampler:
        started = time.monotonic()
        run.send(count, rate=rate)
    run.wait_terminal(count, timeout_s)
    step_figures = standard_figures(pipeline.database_url, run_id,
                                    pipeline.topics.spec.completing_stage, count, ai_limit, [])[0]
    lag = [(round(t - started, 2), n) for t, n in sampler.samples]
    trend = figures.lag_trend([(t, n) for t, n in lag if t >= objective.step_s / 2])
    p99 = None if step_figures["p99_ms"] is None else step_figures["p99_ms"] / 1000
    return Step(rate, sustained(rate, trend, p99, step_figures["lost"], objective), trend, p99,
                step_figures, lag)
