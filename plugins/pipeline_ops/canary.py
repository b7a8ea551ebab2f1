"""A canary on the live topics: its rows, its steps and what each step measures.

The candidate's fleets (`--canary <id>`) run beside the active version's and work on the
partitions the active group lends them (`consumers.canary.loans`); a step lends the first
`ceil(share x partitions)` partitions of each changed stage's source topic, so a growing share
keeps what it had. A step's analysis window opens once the candidate holds every partition it
was lent, and its samples are the two versions' rows over that window
(`consumers.runs.canary_samples`), judged by `measure.canary`. A lent partition the active group
takes back inside the window (the candidate's lease lapsed: its fleet died) fails the step.
The last step (share 1) is the promotion's hand-over, not an analysis: with every partition lent
there is no baseline left to compare with.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow.providers.postgres.hooks.postgres import PostgresHook
from confluent_kafka import Consumer, TopicPartition

from consumers.canary.loans import LENT, LoanStore
from consumers.config import events
from consumers.config.canary_plan import CanaryPlan
from consumers.config.candidate import PipelineConfig
from consumers.config.kafka_connection import KafkaConnection
from consumers.runs.canary_samples import ACTIVE, CANDIDATE, AnalysisWindow, partition_key, samples
from measure.canary import FAIL, MARGINAL, CanaryThresholds, Verdict, judge

HOLD_TIMEOUT_S = 120.0  # for the candidate to take what a step lends it
CHECK_EVERY_S = 1.0
# What a flow member holds of a partition at a window's edge: its window in flight and its fetch
# buffer (MemberSettings.buffer: four windows), records arrived and not yet completed.
HELD_PER_WINDOW = 5


@dataclass(frozen=True)
class Canary:
    """One canary's row."""

    id: int
    pipeline: str
    run_id: str
    active_version: int
    candidate_version: int
    stages: tuple[str, ...]
    plan: CanaryPlan
    thresholds: CanaryThresholds


class CanaryRecords:
    """The `canaries` and `canary_steps` rows."""

    def __init__(self, postgres_conn_id: str = "postgres_default") -> None:
        self.hook = PostgresHook(postgres_conn_id=postgres_conn_id)

    def open(self, pipeline: str, run_id: str, active: int, candidate: int, stages: list[str],
             plan: CanaryPlan, thresholds: CanaryThresholds) -> int:
        document = {"steps": list(plan.steps), "window_s": plan.window_s,
                    "approval_timeout_s": plan.approval_timeout_s, "extensions": plan.extensions,
                    "thresholds": vars(thresholds)}
        return int(self.hook.get_first(
            "INSERT INTO canaries (pipeline, run_id, active_version, candidate_version, stages, plan) "
            "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
            parameters=(pipeline, run_id, active, candidate, stages, json.dumps(document)))[0])

    def get(self, canary_id: int) -> Canary:
        row = self.hook.get_first("SELECT id, pipeline, run_id, active_version, candidate_version, stages, "
                                  "plan FROM canaries WHERE id = %s", parameters=(canary_id,))
        if row is None:
            raise LookupError(f"no canary {canary_id}")
        plan = row[6]
        return Canary(row[0], row[1], row[2], row[3], row[4], tuple(row[5]),
                      CanaryPlan(tuple(plan["steps"]), plan["window_s"], plan["approval_timeout_s"],
                                 plan["extensions"]),
                      CanaryThresholds(**plan["thresholds"]))

    def step_started(self, canary_id: int, step: int, share: float, partitions: int) -> None:
        self.hook.run("INSERT INTO canary_steps (canary_id, step, share, partitions, started_at) "
                      "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (canary_id, step) DO UPDATE SET "
                      "share = excluded.share, partitions = excluded.partitions, started_at = now()",
                      parameters=(canary_id, step, share, partitions))
        self.hook.run("UPDATE canaries SET step = %s WHERE id = %s", parameters=(step, canary_id))

    def step_judged(self, canary_id: int, step: int, window: AnalysisWindow, verdict: str,
                    figures: dict[str, Any]) -> None:
        self.hook.run("UPDATE canary_steps SET started_at = to_timestamp(%s), ended_at = to_timestamp(%s), "
                      "verdict = %s, figures = %s WHERE canary_id = %s AND step = %s",
                      parameters=(window.start, window.end, verdict, json.dumps(figures), canary_id, step))

    def decided(self, canary_id: int, step: int, decision: str) -> None:
        self.hook.run("UPDATE canary_steps SET decision = %s WHERE canary_id = %s AND step = %s",
                      parameters=(decision, canary_id, step))

    def state(self, canary_id: int) -> str:
        row = self.hook.get_first("SELECT state FROM canaries WHERE id = %s", parameters=(canary_id,))
        return str(row[0])

    def close(self, canary_id: int, state: str, reason: str) -> None:
        self.hook.run("UPDATE canaries SET state = %s, reason = %s, ended_at = now() WHERE id = %s",
                      parameters=(state, reason, canary_id))


def lent_partitions(share: float, partitions: int) -> list[int]:
    """The partitions a step lends: the first ceil(share x partitions), at least one."""
    return list(range(min(partitions, max(1, math.ceil(share * partitions - 1e-9)))))


@dataclass
class StageTarget:
    """A changed stage as the canary sees it: its source topic and the active version's group."""

    stage: str
    topic: str
    group: str
    partitions: int


class CanarySteps:
    """Lend, wait, measure and hand back, for one canary, over the loans' store and the cluster."""

    def __init__(self, canary: Canary, configs: dict[str, PipelineConfig], kafka: KafkaConnection,
                 database_url: str) -> None:
        self.canary = canary
        self.configs = configs
        self.kafka = kafka
        self.database_url = database_url
        self.store = LoanStore(database_url)
        topics = events.Topics(canary.run_id, configs[ACTIVE].spec)
        self.targets = [StageTarget(stage, topics.source_of(stage), topics.group_of(stage),
                                    len(kafka.partition_counts(topics.source_of(stage))))
                        for stage in canary.stages]

    def close(self) -> None:
        self.store.close()

    def lend(self, share: float) -> dict[str, list[int]]:
        lent = {}
        for t in self.targets:
            lent[t.stage] = lent_partitions(share, t.partitions)
            self.store.lend(t.group, t.topic, lent[t.stage], self.canary.id)
        return lent

    def held(self, lent: dict[str, list[int]]) -> bool:
        """The candidate holds every partition it was lent."""
        for t in self.targets:
            loans = self.store.loans(t.group, t.topic)
            if any(p not in loans or loans[p].state != LENT or not loans[p].holder or loans[p].lapsed
                   for p in lent[t.stage]):
                return False
        return True

    def wait_held(self, lent: dict[str, list[int]], timeout_s: float = HOLD_TIMEOUT_S) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.held(lent):
            if time.monotonic() > deadline:
                return False
            time.sleep(CHECK_EVERY_S / 2)
        return True

    def log_ends(self) -> dict[int, int]:
        """Each changed stage's source partitions' log-end offsets, keyed as the samples key them."""
        reader = Consumer(self.kafka.client(**{"group.id": f"canary-{self.canary.id}-offsets"}))
        try:
            return {partition_key(i, p): reader.get_watermark_offsets(TopicPartition(t.topic, p),
                                                                      timeout=10)[1]
                    for i, t in enumerate(self.targets) for p in range(t.partitions)}
        finally:
            reader.close()

    def measure(self, lent: dict[str, list[int]], window_s: float,
                extensions: int = 0) -> tuple[AnalysisWindow, Verdict | None, str]:
        """Run one analysis window of `window_s`, lengthened by up to `extensions` more while its
        verdict is marginal (`CanaryPlan`), each look judging everything since the window
        opened; the verdict, or None and why when the candidate lost a partition meanwhile."""
        start, ends_before = time.time(), self.log_ends()
        c = self.canary
        candidate = {partition_key(i, p) for i, t in enumerate(self.targets) for p in lent[t.stage]}
        everything = {partition_key(i, p) for i, t in enumerate(self.targets) for p in range(t.partitions)}
        looks = 0
        while True:
            looks += 1
            deadline = time.monotonic() + window_s
            while time.monotonic() < deadline:
                if not self.held(lent):
                    window = AnalysisWindow(start, time.time(), {})
                    return window, None, "the candidate stopped holding its partitions (its fleet died?)"
                time.sleep(CHECK_EVERY_S)
            end, ends_after = time.time(), self.log_ends()
            arrived = {k: ends_after[k] - ends_before.get(k, 0) for k in ends_after}
            window = AnalysisWindow(start, end, arrived)
            found = samples(self.database_url, c.run_id, c.id, list(c.stages), window,
                            {ACTIVE: self.configs[ACTIVE], CANDIDATE: self.configs[CANDIDATE]},
                            {ACTIVE: everything - candidate, CANDIDATE: candidate},
                            member_in_flight=HELD_PER_WINDOW * max(
                                self.configs[CANDIDATE].stage(s).window for s in c.stages))
            verdict = judge(found[ACTIVE], found[CANDIDATE], c.thresholds)
            if verdict.outcome != MARGINAL or looks > extensions:
                break
        return window, verdict, f"{verdict.outcome} after {looks} window(s) of {window_s:g} s"

    def recall(self, timeout_s: float = HOLD_TIMEOUT_S) -> bool:
        """Ask every lent partition back and wait until the active group has taken all back."""
        for t in self.targets:
            self.store.recall(t.group, t.topic, self.canary.id)
        deadline = time.monotonic() + timeout_s
        while any(self.store.loans(t.group, t.topic) for t in self.targets):
            if time.monotonic() > deadline:
                return False
            time.sleep(CHECK_EVERY_S / 2)
        return True


DONE = "done"  # a step past the plan's analysis steps: nothing to measure


def run_step(canary: Canary, steps: CanarySteps, records: CanaryRecords, step: int) -> dict[str, Any]:
    """Step `step` (from 1): lend its share, wait until the candidate holds it, judge its window,
    record it. A step past the plan's analysis steps has nothing to measure (DONE)."""
    analysed = canary.plan.steps[:-1]  # the last (share 1) is the promotion's hand-over
    if step > len(analysed):
        return {"step": step, "outcome": DONE, "reason": "no analysis step left"}
    share = analysed[step - 1]
    lent = steps.lend(share)
    records.step_started(canary.id, step, share, sum(len(p) for p in lent.values()))
    if not steps.wait_held(lent):
        window, verdict, why = AnalysisWindow(time.time(), time.time(), {}), None, \
            "the candidate did not take the partitions lent to it"
    else:
        window, verdict, why = steps.measure(lent, canary.plan.window_s, canary.plan.extensions)
    outcome = verdict.outcome if verdict is not None else FAIL
    records.step_judged(canary.id, step, window, outcome,
                        verdict.to_dict() if verdict is not None else {"reason": why})
    return {"step": step, "share": share, "outcome": outcome, "reason": why,
            "summary": verdict.summary() if verdict is not None else why}


def promote(canary: Canary, steps: CanarySteps, records: CanaryRecords, restart_live: Callable[[], None],
            stop_canary: Callable[[], None], note: str) -> None:
    """The candidate holds every partition while `restart_live` restarts the live fleets at its
    configuration (they hold back what is lent), then hands them back: no partition waits for a
    fleet to start. The canary's fleets stop once the live ones have taken everything back."""
    if not steps.wait_held(steps.lend(1.0)):
        raise TimeoutError(f"canary {canary.id}: the candidate did not take every partition")
    restart_live()
    if not steps.recall():
        raise TimeoutError(f"canary {canary.id}: the live fleets did not take every partition back")
    stop_canary()
    records.close(canary.id, "promoted", note)


def roll_back(canary: Canary, steps: CanarySteps, records: CanaryRecords, stop_canary: Callable[[], None],
              reason: str) -> None:
    """Every partition back to the live fleets, then the canary's fleets stop."""
    if not steps.recall():
        raise TimeoutError(f"canary {canary.id}: the live fleets did not take every partition back")
    stop_canary()
    records.close(canary.id, "rolled_back", reason)
