"""How often the gate is wrong: false-promotion and false-rejection rates of its statistics with
the default thresholds and trials (a benchmark, not a test: it prints and saves figures).

    python -m bench.gate_stats                      # make gate-stats
    python -m bench.gate_stats --decisions 20 --scale 0.1 --burst 320

Many gate decisions, alternating two kinds of candidate:
- identical to the active version: a rejection is false;
- made 20% slower by raising the stand-in's generation latency by 25% (throughput x 1 / 1.25 =
  0.8): a promotion is false, since the default tolerance is 10%.
Each candidate is `trials` fresh trials, compared as the registry does with the active version's
last passed measurement: the first block of trials, then each identical candidate that passed
(a re-measurement of the same configuration). The decision is `pipeline_ops.gate.evaluate` with
the default `Thresholds` on the trials' figures from `consumers/runs/run_figures.py` (the SQL side,
which a test checks against the Spark analysis the DAG's gate reads). A slower candidate's
capacity is measured slower too, so its utilization still passes: only the regression check
can catch it, as it must.

Trials are bursts through one deployment of the flow preset (fleets as processes, as deployed),
each under a run id of its own on the same topics. The tuning DAG deploys fresh topics and
fleets for every trial, which would make hundreds of trials take hours (docs/gate.md#gate-statistics);
the figure measured, the steady throughput of a burst, is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import requests
from rich.console import Console
from rich.table import Table

from bench.interrupt import unwind_on_sigterm
from bench.report import run_dir
from consumers.config import presets
from consumers.config.candidate import Endpoints
from consumers.config.kafka_connection import KafkaAccess
from consumers.runs.pipeline_run import new_run_id, remove_pipeline, running_pipeline
from consumers.runs.run_figures import burst_figures
from measure.confidence import mean_bounds
from pipeline_ops.gate import Thresholds, evaluate

console = Console()
SLOWER = 1.25  # the slowest endpoint's latency factor: throughput x 0.8


def configure_ai(base_url: str, p: presets.PresetParams, bottleneck_factor: float) -> None:
    requests.put(f"{base_url}/v1/config", timeout=10,
                 json=p.stand_in_settings(bottleneck_factor)).raise_for_status()


def rate(errors: int, decisions: int) -> float | None:
    return errors / decisions if decisions else None


def summarise(decisions: list[dict[str, Any]]) -> dict[str, Any]:
    """False rates per kind, and which checks caused the wrong decisions."""
    out: dict[str, Any] = {}
    for kind, wrong_when in (("identical", False), ("slower", True)):
        mine = [d for d in decisions if d["kind"] == kind]
        wrong = [d for d in mine if d["passed"] == wrong_when]
        causes: dict[str, int] = {}
        for d in mine:
            for name in d["failed"]:
                causes[name] = causes.get(name, 0) + 1
        out[kind] = {"decisions": len(mine), "wrong": len(wrong), "rate": rate(len(wrong), len(mine)),
                     "failed_checks": causes}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--decisions", type=int, default=40, help="gate decisions, half of each kind")
    p.add_argument("--trials", type=int, default=3, help="trials per side of a decision (the DAG's default)")
    p.add_argument("--scale", type=float, default=0.3,
                   help="AI time scale (0.3: the generation takes 0.9 s, the DAG's default)")
    p.add_argument("--partitions", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=16, help="per AI endpoint")
    p.add_argument("--flow-members", type=int, default=2)
    p.add_argument("--burst", type=int, default=160, help="requests per trial (the demo's)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = {k: os.environ[k] for k in ("DATABASE_URL", "AI_SERVICE_URL") if k in os.environ}
    kafka = KafkaAccess.from_environment()
    if kafka is None or len(env) < 2:
        raise SystemExit("the stack's addresses are not set: run `make up` and source .local/stack.env")
    params = presets.PresetParams(partitions=args.partitions, concurrency=args.concurrency,
                                  time_scale=args.scale, burst=args.burst, flow_members=args.flow_members,
                                  replication_factor=min(3, int(os.environ.get("KAFKA_BROKERS", "1"))))
    config = presets.build("flow", params)
    base = env["AI_SERVICE_URL"]
    run_id = new_run_id("gate-stats")
    timeout_s = 120 + 20 * args.burst / params.ai_capacity_rps
    decisions: list[dict[str, Any]] = []
    started = time.monotonic()
    configure_ai(base, params, 1.0)
    endpoints = Endpoints.on(base, params.spec)
    with running_pipeline(config, kafka, env["DATABASE_URL"], endpoints,
                          run_id=run_id, scenario="gate-stats", fleet_processes=True) as pipeline:
        def trials(label: str) -> list[dict[str, Any]]:
            return [burst_figures(pipeline, f"{run_id}-{label}-t{n}", args.burst, args.concurrency,
                                  timeout_s) for n in range(1, args.trials + 1)]

        trials("warmup")  # warm connections and caches: not part of any decision
        reference = trials("active")
        for k in range(1, args.decisions + 1):
            kind = "identical" if k % 2 else "slower"
            configure_ai(base, params, SLOWER if kind == "slower" else 1.0)
            try:
                candidate = trials(f"d{k}-{kind}")
            finally:
                configure_ai(base, params, 1.0)
            decision = evaluate(candidate, Thresholds(), [t["steady_throughput_rps"] for t in reference])
            failed = [c.name for c in decision.checks if not c.passed]
            decisions.append({"decision": k, "kind": kind, "passed": decision.passed, "failed": failed,
                              "reference_rps": [t["steady_throughput_rps"] for t in reference],
                              "candidate_rps": [t["steady_throughput_rps"] for t in candidate],
                              "candidate_utilization": [t["utilization"] for t in candidate],
                              "reasons": decision.reasons()})
            console.print(f"{k:3d}/{args.decisions} {kind:9} {'PROMOTE' if decision.passed else 'reject '} "
                          f"candidate {[t['steady_throughput_rps'] for t in candidate]} rps, utilization "
                          f"{[t['utilization'] for t in candidate]}; failed {failed or '-'} "
                          f"({time.monotonic() - started:.0f}s)")
            if kind == "identical" and decision.passed:  # the registry's reference: last passed
                reference = candidate
    remove_pipeline(pipeline.topics, kafka)
    utilization = [u for d in decisions for u in d["candidate_utilization"] if d["kind"] == "identical"]
    summary = {"run_id": run_id, "args": vars(args), "thresholds": Thresholds().__dict__,
               "ai_capacity_rps_nominal": params.ai_capacity_rps,
               "identical_utilization": mean_bounds(utilization).as_dict() if len(utilization) > 1 else None,
               "rates": summarise(decisions), "seconds": round(time.monotonic() - started),
               "decisions": decisions}
    out = run_dir(run_id)
    (out / "gate_stats.json").write_text(json.dumps(summary, indent=2, default=str))
    table = Table(title=f"gate statistics {run_id}: {args.trials} trials a side, time scale {args.scale}, "
                        f"burst {args.burst}, default thresholds")
    for column in ("candidate", "decisions", "wrong", "rate", "checks that failed"):
        table.add_column(column)
    labels = {"identical": "identical (false rejection)", "slower": "20% slower (false promotion)"}
    for kind, label in labels.items():
        r = summary["rates"][kind]
        table.add_row(label, str(r["decisions"]), str(r["wrong"]),
                      "-" if r["rate"] is None else f"{r['rate']:.1%}", json.dumps(r["failed_checks"]))
    console.print(table)
    console.print(f"results in {out / 'gate_stats.json'}")
    return summary


if __name__ == "__main__":
    unwind_on_sigterm()
    main()
