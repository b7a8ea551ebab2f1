"""Tickets that can wait, drafted by the batch tier, against the same tickets all realtime:
what does the batch tier save, and what does it cost the tickets a person waits on?

    python -m bench.tiers [--tickets 900] [--rate 15] [--waiting 0.7] [--repetitions 1]
                          [--fault none|expired|failed|create-500|slow] [--kill-draft-after S]

support_tickets runs with its fleets in processes of their own against a stand-in started here
(its batch tier at its defaults: a turnaround with a median of 7 minutes and a p99 of an hour,
at real scale). Two arms get the same tickets at the same rate: `realtime`, where no ticket says
it can wait, and `tiered`, where the `--waiting` share of them (7 in every 10, by index) may wait
two hours (`answer_within_s`), so their drafts may come from batches. The other tickets are the
interactive ones, the same in both arms. Per arm, from the rows, the stand-in's counters and a
read_committed reader of the replies: the cost per 1,000 completed tickets by tier, the
interactive tickets' p99 end-to-end latency, deadline misses (a waiting ticket's draft recorded
after its deadline, or never), the batch lines that fell back and what their realtime calls
cost, tickets lost, paid twice and duplicate replies. The arms alternate in order between
repetitions. `--fault` makes the stand-in's batch tier fail in one of its ways (`FAULTS`);
`--kill-draft-after` SIGKILLs each arm's draft fleet that many seconds into its load and starts
another in its place, as a supervisor does, while batches and flex calls are in flight. Figures
and a plot go to results/tiers-<id>/.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict
from typing import Any

import matplotlib.pyplot as plt
import requests
from rich.console import Console
from rich.table import Table

from bench.report import run_dir, save
from bench.stacks import Stack, own_stand_in
from consumers.config.candidate import Endpoints, PipelineConfig, StageConfig
from consumers.loadgen.source import Waiting
from consumers.runs.pipeline_run import running_pipeline
from consumers.runs.run_figures import ATTEMPTS_SQL, attempt_costs, cost_figures, rows
from consumers.runtime.fleet_process import FleetProcess
from consumers.stand_in.batches import BatchConfig
from infra.kafka_tools import topic_values
from measure import figures as figures_of
from measure import tiers as tiers_of
from measure.cost import shown

console = Console()
TIME_SCALE = 0.02  # a batch's median of 7 minutes is 8.4 s here, its p99 72 s
WAIT_S = 7200.0  # what a waiting ticket allows, real scale: 144 s here
DRAIN_S = 2 * WAIT_S * TIME_SCALE + 60  # after the last ticket: every deadline passed, and some
LIMIT = 64  # the stand-in's concurrency per endpoint
BATCH_DEFAULTS = asdict(BatchConfig())  # each arm starts from the stand-in's own batch tier
CONFIG = PipelineConfig(pipeline="support_tickets", partitions=6, time_scale=TIME_SCALE, replication_factor=1,
                        stages={"triage": StageConfig("flow", members=1, window=32),
                                "draft": StageConfig("flow", members=1, window=32)})
ARMS = ("realtime", "tiered")
TIERS = ("realtime", "flex", "batch")
# The batch tier failing in each of its ways (the stand-in's batch settings, real scale): every
# waiting ticket must still be drafted before its deadline, by its fallback.
FAULTS: dict[str, dict[str, float]] = {
    "none": {},
    "expired": {"expire_rate": 1.0, "window_s": 3600.0},  # each batch expires at the hour, half done
    "failed": {"fail_validation_rate": 1.0},  # each batch fails its validation
    "create-500": {"create_error_rate": 1.0},  # no batch is ever created
    "slow": {"median_s": 20000.0, "p99_s": 40000.0},  # beyond the deadline: every line falls back
}


def run_arm(arm: str, stack: Stack, url: str, waiting: Waiting, tickets: int, rate: float,
            run_id: str, fault: str, kill_after_s: float | None = None) -> dict[str, Any]:
    """One arm's run to the end of its deadlines, and its figures."""
    requests.put(f"{url}/v1/config", timeout=10, json={"batches": {**BATCH_DEFAULTS, **FAULTS[fault]}}
                 ).raise_for_status()
    requests.post(f"{url}/v1/stats/reset", timeout=10).raise_for_status()
    console.rule(f"[bold]{run_id}")
    with running_pipeline(CONFIG, stack.kafka, stack.database_url, Endpoints.on(url, CONFIG.spec),
                          run_id=run_id, scenario=f"bench.tiers {arm}", fleet_processes=True) as pipeline, \
            ExitStack() as replacements:
        def crash() -> None:
            killed = pipeline.fleets["draft"]
            assert isinstance(killed, FleetProcess)
            killed.kill()
            console.print(f"draft fleet killed (SIGKILL) {kill_after_s} s into the load; another starts")
            pipeline.fleets["draft"] = replacements.enter_context(FleetProcess(killed.settings).running())
        timer = threading.Timer(kill_after_s, crash) if kill_after_s is not None else None
        if timer is not None:
            timer.start()
        sent = pipeline.send(tickets, rate=rate, progress=True, waiting=waiting if arm == "tiered" else None)
        if timer is not None:
            timer.join()
        counts = pipeline.wait_terminal(tickets, DRAIN_S + tickets / rate, progress=True)
    stats = requests.get(f"{url}/v1/stats", timeout=10).json()
    return arm_figures(stack, pipeline.run_id, pipeline.topics.name("replies"), sent.request_ids,
                       waiting, counts, stats)


def arm_figures(stack: Stack, run_id: str, replies_topic: str, ids: list[str], waiting: Waiting,
                counts: dict[str, int], stats: dict[str, Any]) -> dict[str, Any]:
    db = stack.database_url
    waits = {rid for i, rid in enumerate(ids) if waiting.waits(i)}
    interactive = [rid for rid in ids if rid not in waits]
    completed = figures_of.settled(counts)
    costs = cost_figures(db, run_id, completed, CONFIG.spec)
    latency = dict(rows(db, "SELECT request_id, extract(epoch FROM notified_at - produced_at)::float8 "
                        "FROM requests WHERE run_id = %s AND status = 'completed' "
                        "AND notified_at IS NOT NULL", (run_id,)))
    drafted = dict(rows(db, "SELECT r.request_id, extract(epoch FROM s.completed_at - r.produced_at)::float8 "
                        "FROM requests r JOIN stage_results s USING (pipeline, request_id) "
                        "WHERE r.run_id = %s AND s.stage = 'draft'", (run_id,)))
    lines = Counter(dict(rows(db, "SELECT state, count(*) FROM batch_lines WHERE run_id = %s GROUP BY 1",
                              (run_id,))))
    fallen = {r[0] for r in rows(db, "SELECT request_id FROM batch_lines WHERE run_id = %s "
                                 "AND state = 'fallen_back'", (run_id,))}
    fallback_tries = [a for a in rows(db, ATTEMPTS_SQL, {"run": run_id})
                      if a[0] in fallen and a[1] == "draft" and a[-1] == "realtime"]
    replies = Counter(json.loads(v)["ticket_id"] for v in topic_values(stack.kafka.default, [replies_topic])
                      [replies_topic])
    return {
        "run_id": run_id, "sent": len(ids), "statuses": counts,
        "lost": figures_of.lost(len(ids), counts),
        "cost_per_1k": costs["cost_per_1k_requests"],
        "by_tier_per_1k": {t: costs[f"{t}_cost_per_1k_requests"] for t in TIERS},
        "paid_twice": costs["paid_twice"],
        "stand_in_duplicate_served": sum(e["duplicate_served"] for e in stats.values()
                                         if isinstance(e, dict) and "duplicate_served" in e),
        "duplicate_replies": sum(n - 1 for n in replies.values() if n > 1),
        "interactive": len(interactive),
        "interactive_p99_s": figures_of.percentile([latency[r] for r in interactive if r in latency], 0.99),
        "interactive_latencies_s": sorted(latency[r] for r in interactive if r in latency),
        "waiting": len(waits),
        "deadline_misses": tiers_of.deadline_misses([drafted.get(r) for r in waits], WAIT_S * TIME_SCALE),
        "batch_lines": dict(lines),
        "fallback_cost_per_1k": tiers_of.per_1k(attempt_costs(fallback_tries, completed, CONFIG.spec)["cost"],
                                                completed),
        # the stand-in's counters of this arm (its batches' statuses are counted over its life)
        "batches": {k: stats["batches"][k] for k in ("batches_created", "batches_refused", "lines_served",
                                                     "lines_failed")},
    }


def plot(arms: list[dict[str, dict[str, Any]]], path: Any) -> None:
    """The cost per 1,000 completed tickets by tier, and the interactive tickets' latencies."""
    fig, (costs, latencies) = plt.subplots(1, 2, figsize=(12, 4.5))
    for x, arm in enumerate(ARMS):
        bottom = 0.0
        for tier, colour in zip(TIERS, ("tab:blue", "tab:orange", "tab:green"), strict=True):
            value = sum(rep[arm]["by_tier_per_1k"][tier] or 0.0 for rep in arms) / len(arms)
            costs.bar(x, value, bottom=bottom, color=colour, label=tier if x == 0 else None)
            bottom += value
    costs.set_xticks(range(len(ARMS)), ARMS)
    costs.set_ylabel("cost per 1,000 completed tickets (mean over repetitions)")
    costs.legend()
    for arm, colour in zip(ARMS, ("tab:blue", "tab:green"), strict=True):
        for i, rep in enumerate(arms):
            values = rep[arm]["interactive_latencies_s"]
            share = [(k + 1) / len(values) for k in range(len(values))]
            latencies.plot(values, share, color=colour, alpha=0.8, label=arm if i == 0 else None)
    latencies.set_xscale("log")
    latencies.set_xlabel("interactive tickets' end-to-end latency, s (log)")
    latencies.set_ylabel("share of tickets")
    latencies.legend()
    save(fig, path)


def show(reps: list[dict[str, dict[str, Any]]], ratios: dict[str, Any]) -> None:
    table = Table(title="realtime against the batch tier, per repetition")
    for column in ("rep", "arm", "cost / 1k", *(f"{t} / 1k" for t in TIERS), "interactive p99 s",
                   "deadline misses", "fell back", "lost", "paid twice", "served twice", "dup replies"):
        table.add_column(column, justify="right")
    for i, rep in enumerate(reps, 1):
        for arm in ARMS:
            f = rep[arm]
            table.add_row(str(i), arm, shown(f["cost_per_1k"]),
                          *(shown(f["by_tier_per_1k"][t]) for t in TIERS), shown(f["interactive_p99_s"]),
                          f"{f['deadline_misses']} of {f['waiting']}" if arm == "tiered" else "-",
                          str(f["batch_lines"].get("fallen_back", 0)), str(f["lost"]), str(f["paid_twice"]),
                          str(f["stand_in_duplicate_served"]), str(f["duplicate_replies"]))
    console.print(table)
    console.print(f"tiered / realtime: cost per 1k {shown(ratios['cost_per_1k'])}, "
                  f"interactive p99 {shown(ratios['interactive_p99_s'])} (means over repetitions)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tickets", type=int, default=900)
    p.add_argument("--rate", type=float, default=15.0, help="tickets a second")
    p.add_argument("--waiting", type=float, default=0.7, help="share of the tickets that may wait")
    p.add_argument("--repetitions", type=int, default=1)
    p.add_argument("--fault", choices=FAULTS, default="none", help="how the batch tier fails (FAULTS)")
    p.add_argument("--kill-draft-after", type=float, default=None, metavar="S",
                   help="SIGKILL each arm's draft fleet S seconds into its load, and start another")
    args = p.parse_args()
    stack = Stack.from_environment(os.environ)
    if stack is None:
        raise SystemExit("the stack's addresses are not set: run `make up` and source .local/dev/stack.env")
    bench_id = f"tiers-{uuid.uuid4().hex[:10]}"
    waiting = Waiting(args.waiting, WAIT_S)
    started = time.monotonic()
    reps: list[dict[str, dict[str, Any]]] = []
    with own_stand_in(CONFIG.spec, TIME_SCALE, LIMIT) as url:
        for rep in range(1, args.repetitions + 1):
            order = ARMS if rep % 2 else tuple(reversed(ARMS))
            reps.append({arm: run_arm(arm, stack, url, waiting, args.tickets, args.rate,
                                      f"{bench_id}-{arm}-{rep}", args.fault, args.kill_draft_after)
                         for arm in order})
    ratios = {figure: tiers_of.ratio_of_means([(r["tiered"][figure], r["realtime"][figure]) for r in reps])
              for figure in ("cost_per_1k", "interactive_p99_s")}
    out = run_dir(bench_id)
    summary = {"bench_id": bench_id, "fault": args.fault, "kill_draft_after_s": args.kill_draft_after,
               "tickets": args.tickets, "rate": args.rate,
               "waiting": args.waiting, "wait_s": WAIT_S, "time_scale": TIME_SCALE,
               "seconds": round(time.monotonic() - started), "repetitions": reps, "ratios": ratios}
    (out / "figures.json").write_text(json.dumps(summary, indent=2, default=str))
    plot(reps, out / "tiers.png")
    show(reps, ratios)
    console.print(f"figures in {out}")


if __name__ == "__main__":
    main()
