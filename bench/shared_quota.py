"""Three pipelines on one provider quota, weights 2 : 1 : 1, all backlogged: is the quota
shared by weight, used whole, and never passed?

    python -m bench.shared_quota [--binds concurrency|requests] [--seconds 60] [--time-scale 1]

Each pipeline is the reference pipeline's shape under a name of its own, with its generate
endpoint on the quota, and runs its fleets in processes of their own on the local stack's Kafka
and PostgreSQL. A stand-in started here serves the three, metering the quota as one account and
counting each pipeline's spending by the caller its calls name. Every figure is the stand-in's
count over the window in which all three are backlogged (`measure.quota_share`): each
pipeline's mean calls in flight (or requests a minute) against its weighted share, Jain's index
over the weight-normalised use, the share of the quota used, refusals, and the calls the
account's meter refused as past the quota. Figures and a plot of the shares over time go to
results/shared-quota-<id>/.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import requests
import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.report import RESULTS, save
from bench.stacks import Stack
from consumers.config import pipeline_spec, presets
from consumers.config.candidate import Endpoints
from consumers.runs.pipeline_run import new_run_id, running_pipeline
from measure import quota_share

WEIGHTS = {"tenant_a": 2.0, "tenant_b": 1.0, "tenant_c": 1.0}
QUOTA = "lab_account"
BASE = "generate"  # the endpoint of the reference pipeline that spends the quota
# What the quota allows in each run: the one dimension that binds. Concurrency 48 is under the
# 3 x 64 calls the three fleets could have out; 600 requests a minute under the ~1,000 that
# 48 calls of 3 s make.
LIMITS = {"concurrency": {"concurrency": 48}, "requests": {"requests_per_minute": 600}}
WARM_UP_S = 15.0  # after the fleets joined: every pipeline's backlog has reached generate


def write_pipelines(folder: Path, binds: str) -> Path:
    """A pipelines folder: the shipped specs, three tenants of the reference pipeline with
    generate on the quota, and the quota giving them their weights."""
    (folder / "quotas").mkdir(parents=True, exist_ok=True)
    for shipped in pipeline_spec.PIPELINES_DIR.glob("*.yaml"):
        (folder / shipped.name).write_text(shipped.read_text())
    reference = yaml.safe_load(pipeline_spec.path_of(pipeline_spec.REFERENCE).read_text())
    for name in WEIGHTS:
        reference["name"] = name
        reference["endpoints"][BASE]["quota"] = QUOTA
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(reference, sort_keys=False))
    quota = {"name": QUOTA, "description": "one account the three tenants spend", **LIMITS[binds],
             "pipelines": {name: {"weight": weight} for name, weight in WEIGHTS.items()}}
    (folder / "quotas" / f"{QUOTA}.yaml").write_text(yaml.safe_dump(quota, sort_keys=False))
    return folder


def account(stand_in: str) -> dict[str, Any]:
    return requests.get(f"{stand_in}/v1/stats", timeout=5).json()["accounts"][QUOTA]


def start_stand_in(port: int, time_scale: float) -> subprocess.Popen:
    command = [sys.executable, "-m", "consumers.stand_in", "--pipelines", ",".join(WEIGHTS),
               "--port", str(port), "--time-scale", str(time_scale), "--log-level", "WARNING"]
    process = subprocess.Popen(command, env={**os.environ, "AI_SERVICE_TOKEN": ""})
    deadline = time.monotonic() + 30
    while True:
        try:
            requests.get(f"http://127.0.0.1:{port}/v1/stats", timeout=1).raise_for_status()
            return process
        except requests.RequestException:
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("the stand-in did not start") from None
            time.sleep(0.2)


def figures(first: dict[str, Any], last: dict[str, Any], seconds: float, binds: str,
            capacity: float, time_scale: float) -> dict[str, Any]:
    """The window's figures from two readings of the account's counters."""
    def delta(caller: str, counter: str) -> float:
        before, after = first["callers"].get(caller, {}), last["callers"].get(caller, {})
        return after.get(counter, 0) - before.get(counter, 0)

    if binds == "concurrency":  # mean calls in flight over the window
        used = {name: delta(name, "busy_s") / seconds for name in WEIGHTS}
    else:  # requests a minute of the endpoint's clock
        used = {name: delta(name, "requests") * 60 * time_scale / seconds for name in WEIGHTS}
    served = sum(delta(name, "served") for name in WEIGHTS)
    refused = sum(sum(last["callers"].get(n, {}).get("refused", {}).values())
                  - sum(first["callers"].get(n, {}).get("refused", {}).values()) for n in WEIGHTS)
    return {
        "binds": binds, "capacity": capacity, "window_s": seconds, "used": used,
        "share_of_fair": quota_share.share_of_fair(used, WEIGHTS, capacity),
        "weighted_jain": quota_share.weighted_jain(used, WEIGHTS),
        "quota_used": quota_share.quota_used(sum(used.values()), capacity),
        "served": served, "refused": refused,
        "refused_share": refused / (served + refused) if served + refused else 0.0,
        "over_quota": last["over_quota"] - first["over_quota"],
        "max_in_flight": last["max_in_flight"],
    }


def run(stack: Stack, binds: str, seconds: float, time_scale: float, port: int) -> dict[str, Any]:
    capacity = float(next(iter(LIMITS[binds].values())))
    with tempfile.TemporaryDirectory() as folder, ExitStack() as running:
        os.environ["PIPELINES_DIR"] = str(write_pipelines(Path(folder), binds))
        stand_in = start_stand_in(port, time_scale)
        running.callback(stand_in.terminate)
        url = f"http://127.0.0.1:{port}"
        pipelines = []
        for name in WEIGHTS:
            params = presets.PresetParams(partitions=8, concurrency=64, time_scale=time_scale,
                                          flow_members=2, pipeline=name)
            config = presets.build("flow", params)
            endpoints = Endpoints.on(url, pipeline_spec.load(name))
            pipelines.append(running.enter_context(running_pipeline(
                config, stack.kafka, stack.database_url, endpoints, run_id=new_run_id(name.replace("_", "-")),
                scenario="shared-quota", fleet_processes=True)))
        # More than each can finish in the run: all stay backlogged to the end.
        per_second = capacity / 3.0 / time_scale if binds == "concurrency" else capacity / 60 / time_scale
        for pipeline, weight in zip(pipelines, WEIGHTS.values(), strict=True):
            pipeline.send(int(2 * per_second * weight / sum(WEIGHTS.values()) * (WARM_UP_S + seconds)) + 100)
        series: list[tuple[float, dict[str, Any]]] = []
        started = time.monotonic()
        with Progress(transient=True) as bar:
            task = bar.add_task(f"shared quota, {binds} binds", total=WARM_UP_S + seconds)
            while (elapsed := time.monotonic() - started) < WARM_UP_S + seconds:
                series.append((elapsed, account(url)))
                bar.update(task, completed=elapsed)
                time.sleep(1.0)
        series.append((time.monotonic() - started, account(url)))
    os.environ.pop("PIPELINES_DIR", None)
    window = [(at, reading) for at, reading in series if at >= WARM_UP_S]
    (t0, first), (t1, last) = window[0], window[-1]
    result = figures(first, last, t1 - t0, binds, capacity, time_scale)
    result["series"] = [(at, {n: r["callers"].get(n, {}).get("busy_s", 0.0) for n in WEIGHTS})
                        for at, r in series]
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    """Each pipeline's calls in flight over time (per second, from the busy-seconds counter)."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    series = result["series"]
    for name, weight in WEIGHTS.items():
        xs = [b[0] for b in series[1:]]
        ys = [(b[1][name] - a[1][name]) / (b[0] - a[0]) for a, b in itertools.pairwise(series)]
        ax.plot(xs, ys, label=f"{name} (weight {weight:g})")
    ax.axvline(WARM_UP_S, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("seconds")
    ax.set_ylabel("calls in flight at the stand-in")
    ax.set_title(f"one quota of {result['capacity']:g} ({result['binds']}) shared 2 : 1 : 1")
    ax.legend()
    save(fig, path)


def report(results: list[dict[str, Any]]) -> Table:
    table = Table(title="shared quota: three pipelines, weights 2 : 1 : 1, all backlogged")
    for column in ("binds", "share of fair (a, b, c)", "Jain", "quota used", "refused", "past quota"):
        table.add_column(column)
    for r in results:
        fair = ", ".join(f"{r['share_of_fair'][n]:.3f}" for n in WEIGHTS)
        table.add_row(r["binds"], fair, f"{r['weighted_jain']:.4f}", f"{r['quota_used']:.3f}",
                      f"{r['refused_share']:.2%}", str(r["over_quota"]))
    return table


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binds", default="concurrency", help="comma-separated: concurrency, requests")
    p.add_argument("--seconds", type=float, default=60.0, help="the measured window, after the warm-up")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--port", type=int, default=8650, help="the stand-in's port")
    args = p.parse_args(argv)
    stack = Stack.from_environment(os.environ)
    if stack is None:
        raise SystemExit("the stack's addresses are not set: run `make up` and source .local/dev/stack.env")
    out = RESULTS / f"shared-quota-{new_run_id('q').split('-')[1]}"
    out.mkdir(parents=True)
    results = []
    for binds in args.binds.split(","):
        result = run(stack, binds, args.seconds, args.time_scale, args.port)
        plot(result, out / f"shares-{binds}.png")
        results.append(result)
    (out / "figures.json").write_text(json.dumps(results, indent=1))
    Console().print(report(results))
    print(f"figures and plots in {out}")


if __name__ == "__main__":
    main()
