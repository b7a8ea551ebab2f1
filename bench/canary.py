"""Canaries on live support tickets: is a worse candidate rolled back by itself at its first step,
an identical one promoted through every step, and is every ticket handled once meanwhile?

    python -m bench.canary                 # a slower and dearer draft model, an identical
                                           # candidate, and a candidate killed mid-step
    python -m bench.canary --stats 20      # 20 canaries of each kind: the judge's error rates

The live deployment is support_tickets (the exactly-once preset) with its fleets in processes of
their own, under a steady load at 80 % of its capacity for the whole run, against a stand-in
started here. Each canary runs as `pipeline_canary` runs it (`pipeline_ops.canary`: the same
steps, judge and hand-overs), with its candidate's draft fleet in a process of its own. The
slower candidate's draft model answers 30 % slower and costs 50 % more per token
(`large_model_next`). A step judged marginal counts as rolled back (what the review's timeout
does). With `--stats` an identical candidate's promotion is decided but its hand-over skipped
(the live fleets keep their configuration between trials); the headline run promotes for real.
At the end: tickets lost, duplicate replies as a `read_committed` reader (Kafka's console
consumer) sees them, and the platform's paid-twice calls against the stand-in's own count.
Figures and a plot go to results/canary-<id>/.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack, closing
from dataclasses import replace
from typing import Any

import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from bench.report import run_dir, save
from bench.stacks import Stack, own_stand_in
from consumers.config.canary_plan import CanaryPlan
from consumers.config.candidate import Endpoints, PipelineConfig, StageConfig
from consumers.kafka_clients.producer import KeyedProducer
from consumers.loadgen.source import send_requests
from consumers.runs.canary_samples import ACTIVE, CANDIDATE
from consumers.runs.pipeline_run import Pipeline, running_pipeline
from consumers.runs.run_figures import cost_figures, rows
from consumers.runtime.fleet_process import FleetProcess
from consumers.runtime.fleet_settings import settings_for
from infra.kafka_tools import topic_values
from measure.canary import PASS, CanaryThresholds
from measure.figures import TERMINAL
from pipeline_ops.canary import DONE, CanaryRecords, CanarySteps, promote, roll_back, run_step
from pipeline_ops.registry import ConfigRegistry

PIPELINE = "support_tickets"
STAGE = "draft"  # the stage both candidates change (a model switch) or keep
# Against a real model a request's end-to-end latency is mostly its AI calls; at smaller time
# scales the platform's own milliseconds (and this machine's stalls, which fall on one side of a
# canary at a time) weigh more, and an identical candidate's windows drifted by 10 % and more.
TIME_SCALE = 0.2
LIMIT = 32  # the stand-in's concurrency per endpoint: the draft model binds
LOAD_SHARE = 0.8
REVIEW_TIMEOUT_S = 1.0  # a marginal step is not reviewed here: its timeout rolls it back
ACTIVE_CONFIG = PipelineConfig(pipeline=PIPELINE, partitions=10, time_scale=TIME_SCALE, replication_factor=1,
                               exactly_once=True,
                               stages={"triage": StageConfig("flow", members=1, window=32),
                                       STAGE: StageConfig("flow", members=1, window=32)})
CANDIDATES = {"slower": ACTIVE_CONFIG.with_overrides({STAGE: {"work": {"endpoint": "large_model_next"}}}),
              "identical": ACTIVE_CONFIG}
EXPECTED = {"slower": "rolled_back", "identical": "promoted"}

# The draft results over a canary's life (its row's start to end) and those its fleet made.
HANDLED_SQL = ("SELECT count(*) FILTER (WHERE f.canary = %s), count(*) FROM stage_results s "
               "JOIN fleet_members f USING (run_id, member) JOIN canaries c ON c.run_id = s.run_id "
               "WHERE s.stage = %s AND c.id = %s AND s.completed_at BETWEEN c.started_at AND c.ended_at")

console = Console()


def capacity_rps(config: PipelineConfig) -> float:
    """A lower bound of the pipeline's capacity: the draft endpoint's concurrency over its mean
    call, answers taken at their longest (`max_tokens`), at the run's time scale."""
    spec = config.spec
    work = spec.stages[STAGE].work
    endpoint = spec.endpoint_of(STAGE)
    assert endpoint is not None  # draft calls an endpoint
    latency = endpoint.latency
    call_s = latency.mean_s + latency.per_output_token_s * (getattr(work, "max_tokens", 0) or 0)
    return LIMIT / (call_s * config.time_scale)


class LiveLoad:
    """Tickets sent at a steady rate from a thread until stopped; their ids kept."""

    def __init__(self, stack: Stack, pipeline: Pipeline, rate: float) -> None:
        self.stack, self.pipeline, self.rate = stack, pipeline, rate
        self.sent: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, name="live-load", daemon=True)

    def _send(self) -> None:
        producer = KeyedProducer(self.stack.kafka.of("source"), key_strategy="uuid")
        while not self._stop.is_set():
            report = send_requests(producer, self.pipeline.topics, self.pipeline.run_id,
                                   max(1, int(self.rate)), rate=self.rate, seed=len(self.sent),
                                   progress=False)
            self.sent += report.request_ids
        producer.close()

    def __enter__(self) -> LiveLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Live:
    """The live deployment: its pipeline, its draft fleet (replaced at a promotion)."""

    def __init__(self, stack: Stack, pipeline: Pipeline, endpoints: Any, cleanup: ExitStack) -> None:
        self.stack, self.pipeline, self.endpoints, self.cleanup = stack, pipeline, endpoints, cleanup
        self.config = ACTIVE_CONFIG
        self.draft = pipeline.fleets[STAGE]

    def settings(self, config: PipelineConfig) -> Any:
        return settings_for(config, STAGE, self.pipeline.run_id, self.pipeline.topics, self.stack.kafka,
                            self.stack.database_url, self.endpoints)

    def restart_draft(self, config: PipelineConfig) -> None:
        """The draft fleet at `config`: the new one started (it holds back what is lent) before
        the old one stops."""
        fleet = FleetProcess(replace(self.settings(config), instance=f"live{uuid.uuid4().hex[:4]}"))
        self.cleanup.enter_context(fleet.running())
        fleet.wait_assigned()
        self.draft.request_stop()
        self.draft, self.config = fleet, config


def one_canary(kind: str, live: Live, registry: ConfigRegistry, records: CanaryRecords, plan: CanaryPlan,
               promote_for_real: bool, kill_after_s: float | None = None) -> dict[str, Any]:
    """A canary of the `kind` candidate to its decision, as `pipeline_canary` runs it."""
    candidate = CANDIDATES[kind]
    active = registry.register("canary-active", live.config, note="bench.canary")
    version = registry.register(f"canary-{kind}", candidate, note="bench.canary")
    canary = records.get(records.open(PIPELINE, live.pipeline.run_id, active, version, [STAGE], plan,
                                      CanaryThresholds()))
    fleet = FleetProcess(replace(live.settings(candidate), instance=f"canary{canary.id}", version=version,
                                 canary=canary.id))
    started, results, taken_back_s = time.monotonic(), [], None
    killed: list[float] = []

    def kill() -> None:
        killed.append(time.monotonic())
        fleet.kill()

    with fleet.running(), closing(CanarySteps(canary, {ACTIVE: live.config, CANDIDATE: candidate},
                                              live.stack.kafka.default, live.stack.database_url)) as steps:
        fleet.wait_assigned()
        if kill_after_s is not None:
            threading.Timer(kill_after_s, kill).start()
        for step in range(1, len(plan.steps) + 1):
            results.append(run_step(canary, steps, records, step))
            if results[-1]["outcome"] != PASS:
                break
        promoted = results[-1]["outcome"] == DONE
        if killed:
            while any(steps.store.loans(t.group, t.topic) for t in steps.targets):
                time.sleep(0.2)
            taken_back_s = round(time.monotonic() - killed[0], 1)
        if promoted and promote_for_real:
            promote(canary, steps, records, lambda: live.restart_draft(candidate), lambda: None,
                    "bench.canary: every step passed")
        else:
            roll_back(canary, steps, records, lambda: None,
                      "promotion decided; hand-over skipped between trials" if promoted
                      else f"step {results[-1]['step']}: {results[-1]['outcome']}")
    handled, total = rows(live.stack.database_url, HANDLED_SQL, (canary.id, STAGE, canary.id))[0]
    return {"kind": kind, "canary": canary.id, "decision": "promoted" if promoted else "rolled_back",
            "candidate_handled": handled, "candidate_share": handled / total if total else None,
            "steps": [{k: r[k] for k in ("step", "outcome", "reason") if k in r} | {"share": r.get("share")}
                      for r in results], "summaries": [r.get("summary") for r in results],
            "seconds": round(time.monotonic() - started, 1), "taken_back_s": taken_back_s}


def delivered_once(live: Live, sent: list[str], stand_in_url: str) -> dict[str, Any]:
    """Lost tickets, duplicate replies (read_committed) and paid-twice calls, once drained."""
    import requests

    run_id, topics = live.pipeline.run_id, live.pipeline.topics
    settled = {row[0] for row in rows(live.stack.database_url, "SELECT request_id FROM requests "
                                      "WHERE run_id = %s AND status = ANY(%s)", (run_id, list(TERMINAL)))}
    replies = topic_values(live.stack.kafka.default, [topics.name("replies")])[topics.name("replies")]
    per_ticket = Counter(json.loads(value)["ticket_id"] for value in replies)
    stats = requests.get(f"{stand_in_url}/v1/stats", timeout=5).json()
    completed = len(settled)
    return {"sent": len(sent), "lost": len(set(sent) - settled),
            "duplicate_replies": sum(n - 1 for n in per_ticket.values() if n > 1),
            "paid_twice": cost_figures(live.stack.database_url, run_id, completed,
                                       ACTIVE_CONFIG.spec)["paid_twice"],
            "stand_in_duplicate_served": sum(e["duplicate_served"] for name, e in stats.items()
                                             if isinstance(e, dict) and "duplicate_served" in e)}


def plot(database_url: str, run_id: str, trials: list[dict[str, Any]], path: Any) -> None:
    """Draft completions per second by side, and the canaries' windows."""
    found = rows(database_url, "SELECT extract(epoch FROM s.completed_at)::bigint, f.canary IS NOT NULL, "
                 "count(*) FROM stage_results s JOIN fleet_members f USING (run_id, member) "
                 "WHERE s.run_id = %s AND s.stage = %s GROUP BY 1, 2 ORDER BY 1", (run_id, STAGE))
    windows = rows(database_url, "SELECT extract(epoch FROM started_at), extract(epoch FROM ended_at), "
                   "verdict FROM canary_steps WHERE canary_id = ANY(%s) AND ended_at IS NOT NULL",
                   ([t["canary"] for t in trials],))
    if not found:
        return
    start = min(int(r[0]) for r in found)
    fig, ax = plt.subplots(figsize=(11, 4))
    for side, label in ((False, "active"), (True, "candidate")):
        points = [(int(t) - start, n) for t, canary, n in found if canary == side]
        ax.plot([p[0] for p in points], [p[1] for p in points], label=label, linewidth=1)
    colours = {"pass": "tab:green", "fail": "tab:red", "marginal": "tab:orange"}
    for begin, end, verdict in windows:
        ax.axvspan(float(begin) - start, float(end) - start, color=colours.get(verdict, "grey"), alpha=0.15)
    ax.set_xlabel("seconds")
    ax.set_ylabel("draft completions / s")
    ax.set_title("canary windows (green pass, red fail, orange marginal)")
    ax.legend()
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stats", type=int, default=0, help="canaries of each kind for the judge's error rates")
    p.add_argument("--window", type=float, default=15.0, help="seconds of analysis per step")
    p.add_argument("--steps", default="0.1,0.5,1.0", help="the candidate's shares, ending at 1")
    args = p.parse_args()
    stack = Stack.from_environment(os.environ)
    if stack is None:
        raise SystemExit("the stack's addresses are not set: run `make up` and source .local/dev/stack.env")
    plan = CanaryPlan(tuple(float(s) for s in args.steps.split(",")), args.window,
                      approval_timeout_s=REVIEW_TIMEOUT_S)
    bench_id = f"canary-{uuid.uuid4().hex[:10]}"
    rate = LOAD_SHARE * capacity_rps(ACTIVE_CONFIG)
    console.print(f"{bench_id}: support_tickets live at {rate:.1f} tickets/s "
                  f"(80 % of {rate / LOAD_SHARE:.1f})")
    registry, records = ConfigRegistry(), CanaryRecords()
    trials: list[dict[str, Any]] = []
    with own_stand_in(ACTIVE_CONFIG.spec, TIME_SCALE, LIMIT) as url, ExitStack() as cleanup:
        endpoints = Endpoints.on(url, ACTIVE_CONFIG.spec)
        pipeline = cleanup.enter_context(running_pipeline(
            ACTIVE_CONFIG, stack.kafka, stack.database_url, endpoints, stages=("triage", STAGE),
            fleet_processes=True, scenario="bench.canary"))
        live = Live(stack, pipeline, endpoints, cleanup)
        with LiveLoad(stack, pipeline, rate) as load:
            runs: list[tuple[str, bool, float | None]] = (
                [(kind, False, None) for _ in range(args.stats) for kind in CANDIDATES] if args.stats
                else [("slower", True, None), ("identical", True, None),
                      ("identical", True, args.window / 2)])
            for i, (kind, real, kill) in enumerate(runs, start=1):
                trial = one_canary(kind, live, registry, records, plan, real, kill)
                trial["killed"] = kill is not None
                trials.append(trial)
                console.print(f"[{i}/{len(runs)}] {kind}{' (killed)' if kill else ''}: {trial['decision']} "
                              f"after {len(trial['steps'])} step(s), {trial['seconds']} s, "
                              f"{trial['candidate_handled']} drafts by the candidate; "
                              f"{trial['summaries'][-1] or ''}")
            sent = load.sent
        drained_by = time.monotonic() + 120
        while time.monotonic() < drained_by and rows(
                stack.database_url,
                "SELECT count(*) FROM requests WHERE run_id = %s AND NOT status = ANY(%s)",
                (pipeline.run_id, list(TERMINAL)))[0][0]:
            time.sleep(1)
        delivery = delivered_once(live, sent, url)
    out = run_dir(bench_id)
    summary = {"bench_id": bench_id, "run_id": pipeline.run_id, "rate_rps": rate, "plan": vars(plan),
               "trials": trials, "delivery": delivery, "error_rates": error_rates(trials)}
    (out / "figures.json").write_text(json.dumps(summary, indent=2, default=str))
    plot(stack.database_url, pipeline.run_id, trials, out / "canary.png")
    show(summary)
    console.print(f"figures in {out}")


def error_rates(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind: trials, decisions against the expected one, and the mean seconds each took."""
    result = {}
    for kind, expected in EXPECTED.items():
        mine = [t for t in trials if t["kind"] == kind and not t["killed"]]
        wrong = sum(t["decision"] != expected for t in mine)
        result[kind] = {"trials": len(mine), "expected": expected, "wrong": wrong,
                        "error_rate": wrong / len(mine) if mine else None,
                        "first_step_rollbacks": sum(t["decision"] == "rolled_back" and len(t["steps"]) == 1
                                                    for t in mine),
                        "mean_seconds": round(sum(t["seconds"] for t in mine) / len(mine), 1)
                        if mine else None}
    return result


def show(summary: dict[str, Any]) -> None:
    table = Table(title="canaries")
    for column in ("kind", "trials", "expected", "wrong", "error rate", "rolled back at step 1",
                   "s per canary"):
        table.add_column(column)
    for kind, r in summary["error_rates"].items():
        table.add_row(kind, str(r["trials"]), r["expected"], str(r["wrong"]),
                      "-" if r["error_rate"] is None else f"{r['error_rate']:.3f}",
                      str(r["first_step_rollbacks"]),
                      str(r["mean_seconds"]))
    console.print(table)
    console.print(summary["delivery"])
    for t in summary["trials"]:
        if t["killed"]:
            console.print(f"killed candidate (canary {t['canary']}): {t['decision']}; partitions back "
                          f"with the active group after {t['taken_back_s']:.1f} s")


if __name__ == "__main__":
    main()
