"""Three pipelines on one provider quota, weights 2 : 1 : 1, all backlogged: is the quota
shared by weight, used whole, and never passed?

    python -m bench.shared_quota [--binds concurrency,requests] [--seconds 60] [--idle 60]

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
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import psycopg2
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.quota_lab import (
    LIMITS,
    TOKENS_PER_CALL,
    WEIGHTS,
    Sampler,
    busy,
    in_flight,
    tenants,
)
from bench.report import RESULTS, save
from bench.stacks import Stack
from consumers.runs.pipeline_run import new_run_id
from consumers.runtime.fleet_process import FleetProcess
from measure import figures as figures_of
from measure import quota_share

WARM_UP_S = 15.0  # after the fleets joined: every pipeline's backlog has reached generate
RETURN_S = 30.0  # how long an idle pipeline's return is watched
STEP_S = 15.0  # between two processes added to a fleet
KILLED_S = 45.0  # watched after a process is killed: its lease, then its calls' longest try
SETTLE_S = 5.0  # a step's first seconds, while the group rebalances, are not its figure
ADDED_WINDOW = 8  # records in flight in each process added (one member each: a pod's share)
QUIET_S = 2.0  # no call out for this long: the pipeline is idle
INTERACTIVE = "tenant_a"  # the pipeline moved to the interactive lane
DRAIN_S = 10.0  # the interactive load ends this long before the run: its last requests complete
LANE_WARM_UP_S = 30.0  # the interactive load's first seconds, while the others' calls make room
LATENCIES_SQL = ("SELECT extract(epoch FROM notified_at - produced_at) FROM requests WHERE run_id = %s "
                 "AND status = 'completed' AND produced_at >= to_timestamp(%s)")
DEAD_LETTERED_SQL = "SELECT count(*) FROM dead_letters WHERE run_id = ANY(%s)"


def figures(first: dict[str, Any], last: dict[str, Any], seconds: float, binds: str,
            capacity: float, time_scale: float) -> dict[str, Any]:
    """The window's figures from two readings of the account's counters."""
    def delta(caller: str, counter: str) -> float:
        before, after = first["callers"].get(caller, {}), last["callers"].get(caller, {})
        return after.get(counter, 0) - before.get(counter, 0)

    if binds == "concurrency":  # mean calls in flight over the window
        used = {name: delta(name, "busy_s") / seconds for name in WEIGHTS}
    elif binds == "requests":  # requests a minute of the endpoint's clock
        used = {name: delta(name, "requests") * 60 * time_scale / seconds for name in WEIGHTS}
    else:  # tokens a minute, input and output (the quota counts both)
        used = {name: (delta(name, "tokens_input") + delta(name, "tokens_output")) * 60 * time_scale / seconds
                for name in WEIGHTS}
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


def rates(binds: str, capacity: float, time_scale: float) -> dict[str, float]:
    """Each pipeline's fair share in records a second (a generate call of 3 s each)."""
    per_call = {"concurrency": 3.0, "requests": 60.0, "tokens": 60.0 * TOKENS_PER_CALL}[binds]
    per_second = capacity / per_call / time_scale
    return {name: per_second * weight / sum(WEIGHTS.values()) for name, weight in WEIGHTS.items()}


def backlogged(stack: Stack, binds: str, seconds: float, time_scale: float, port: int) -> dict[str, Any]:
    """All three backlogged for the whole window: the shares, Jain's index, the quota used."""
    capacity = float(next(iter(LIMITS[binds].values())))
    with tenants(stack, binds, time_scale, port) as (url, pipelines), Progress(transient=True) as bar:
        for name, rate in rates(binds, capacity, time_scale).items():  # more than each can finish
            pipelines[name].send(int(2 * rate * (WARM_UP_S + seconds)) + 100)
        sampler = Sampler(url, bar, WARM_UP_S + seconds, f"shared quota, {binds} binds")
        sampler.until(lambda: sampler.elapsed() >= WARM_UP_S + seconds)
        window = [(at, reading) for at, reading in sampler.series if at >= WARM_UP_S]
        (t0, first), (t1, last) = window[0], window[-1]
        result = figures(first, last, t1 - t0, binds, capacity, time_scale)
        result["series"] = busy(sampler.series)
    return result


def idle_and_return(stack: Stack, time_scale: float, port: int, idle_s: float) -> dict[str, Any]:
    """tenant_c idle for `idle_s`, then back: how soon the others fill the quota once it is
    idle, and how soon it has its share again once it is back (calls at once bind)."""
    binds, idle, others = "concurrency", "tenant_c", ("tenant_a", "tenant_b")
    capacity = float(LIMITS[binds]["concurrency"])
    share = rates(binds, capacity, time_scale)
    due = capacity * WEIGHTS[idle] / sum(WEIGHTS.values())
    with tenants(stack, binds, time_scale, port) as (url, pipelines), Progress(transient=True) as bar:
        total = WARM_UP_S + idle_s + 2 * RETURN_S
        for name, rate in share.items():
            pipelines[name].send(int(rate * WARM_UP_S) if name == idle else int(2 * rate * total) + 100)
        sampler = Sampler(url, bar, total, f"shared quota, {idle} idle for {idle_s:g} s")

        def use_of(name: str) -> float:
            recent = in_flight(busy(sampler.series[-2:]))
            return recent[-1][1][name] if recent else 0.0

        def quiet_since() -> float | None:
            """When the idle pipeline's last call ended, if none has been out for QUIET_S."""
            calls = [(at, r["callers"].get(idle, {}).get("in_flight", 0)) for at, r in sampler.series]
            busy_at = max((at for at, n in calls if n), default=None)
            since = next((at for at, _ in calls if busy_at is not None and at > busy_at), None)
            return since if since is not None and calls[-1][0] - since >= QUIET_S else None

        sampler.until(lambda: len(sampler.series) > 2 and use_of(idle) >= due / 2)  # it has its share
        sampler.until(lambda: quiet_since() is not None)
        idle_at = quiet_since() or 0.0
        sampler.until(lambda: sampler.elapsed() >= idle_at + idle_s)
        pipelines[idle].send(int(2 * share[idle] * RETURN_S) + 100)
        back_at = sampler.elapsed()
        sampler.until(lambda: sampler.elapsed() >= back_at + RETURN_S)
        curve = in_flight(busy(sampler.series))
    filled = next((at for at, use in curve
                   if at > idle_at and sum(use[n] for n in others) >= 0.95 * capacity), None)
    regained = next((at for at, use in curve if at > back_at and use[idle] >= 0.95 * due), None)
    return {"binds": "idle-and-return", "capacity": capacity, "idle_s": idle_s, "idle_at": idle_at,
            "back_at": back_at, "filled_s": None if filled is None else filled - idle_at,
            "regained_s": None if regained is None else regained - back_at,
            "series": busy(sampler.series)}


def latencies_s(database_url: str, run_id: str, produced_from: float) -> list[float]:
    """End-to-end latencies of the run's completed requests produced from `produced_from`
    (epoch s), as the run figures count them: produced to notified."""
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(LATENCIES_SQL, (run_id, produced_from))
        return [float(seconds) for (seconds,) in cur.fetchall()]


def lane_phase(stack: Stack, time_scale: float, port: int, seconds: float, crowded: bool) -> dict[str, Any]:
    """tenant_a in the interactive lane at a steady third of the quota; `crowded`, tenant_b
    and tenant_c offered the rest of three times the quota's worth beside it."""
    binds, capacity = "concurrency", float(LIMITS["concurrency"]["concurrency"])
    total_rate = sum(rates(binds, capacity, time_scale).values())
    steady = total_rate / 3
    run_s = LANE_WARM_UP_S + seconds
    with tenants(stack, binds, time_scale, port, lanes={INTERACTIVE: "interactive"}) as (url, pipelines), \
            Progress(transient=True) as bar:
        # The steady load starts with the others' backlog, in threads of its own: the window
        # opens once the shares have settled beside it.
        loads = {INTERACTIVE: ((int(steady * (run_s - DRAIN_S)),), {"rate": steady})}
        if crowded:
            loads |= {name: ((int((3 * total_rate - steady) / 2 * run_s) + 100,), {})
                      for name in WEIGHTS.keys() - {INTERACTIVE}}
        senders = [threading.Thread(target=pipelines[name].send, args=args, kwargs=kwargs)
                   for name, (args, kwargs) in loads.items()]
        title = f"{INTERACTIVE} interactive, {'crowded' if crowded else 'alone'}"
        sampler = Sampler(url, bar, run_s, title)
        started_epoch = time.time()
        for sender in senders:
            sender.start()
        sampler.until(lambda: sampler.elapsed() >= run_s)
        for sender in senders:
            sender.join()
        window = [(at, reading) for at, reading in sampler.series if at >= LANE_WARM_UP_S]
        (t0, first), (t1, last) = window[0], window[-1]
        result = figures(first, last, t1 - t0, binds, capacity, time_scale)
        lat = latencies_s(stack.database_url, pipelines[INTERACTIVE].run_id, started_epoch + LANE_WARM_UP_S)
        with psycopg2.connect(stack.database_url) as conn, conn.cursor() as cur:
            cur.execute(DEAD_LETTERED_SQL, ([p.run_id for p in pipelines.values()],))
            dead = cur.fetchone()[0]
    left = capacity - result["used"][INTERACTIVE]
    others = {n: w for n, w in WEIGHTS.items() if n != INTERACTIVE}
    share_of_left = quota_share.share_of_fair({n: result["used"][n] for n in others}, others, left)
    result.update(binds="interactive " + ("crowded" if crowded else "alone"), series=busy(sampler.series),
                  p99_s=figures_of.percentile(lat, 0.99), completed=len(lat), dead_lettered=dead,
                  share_of_left=share_of_left if crowded else {})
    return result


def interactive_lane(stack: Stack, time_scale: float, port: int, seconds: float) -> list[dict[str, Any]]:
    """The interactive pipeline's latency alone, then with three times the quota offered."""
    return [lane_phase(stack, time_scale, port, seconds, crowded) for crowded in (False, True)]


@contextmanager
def another_process(fleet: FleetProcess) -> Iterator[FleetProcess]:
    """One more process of a stage's fleet, running inside; one killed on purpose ends quietly."""
    try:
        with fleet.running():
            fleet.wait_assigned()
            yield fleet
    except RuntimeError:
        if fleet.exitcode != -signal.SIGKILL:
            raise


def scaling(stack: Stack, time_scale: float, port: int) -> dict[str, Any]:
    """tenant_a's generate fleet grows from one process to four, a process of its own each (as
    pods are), then one of them is killed: the pipeline's use stays at its one share, tenant_b's
    at its own, and the killed process's grant is taken by its peers once its lease and drain
    are over. Calls at once bind; both are backlogged. Two pipelines, not three: the added
    processes' database pools come out of what three pipelines' fleets leave the server."""
    binds, grown, names = "concurrency", "tenant_a", ("tenant_a", "tenant_b")
    capacity = float(LIMITS[binds]["concurrency"])
    due = capacity * WEIGHTS[grown] / sum(WEIGHTS[n] for n in names)
    total = WARM_UP_S + 4 * STEP_S + KILLED_S
    marks: list[tuple[str, float]] = []
    with tenants(stack, binds, time_scale, port, names=names) as (url, pipelines), ExitStack() as extra, \
            Progress(transient=True) as bar:
        for name, rate in rates(binds, capacity, time_scale).items():
            if name in pipelines:
                pipelines[name].send(int(4 * rate * total) + 100)
        sampler = Sampler(url, bar, total, f"{grown}: one process to four, then one killed")
        sampler.until(lambda: sampler.elapsed() >= WARM_UP_S)
        marks.append(("1 process", sampler.elapsed()))
        sampler.until(lambda: sampler.elapsed() >= WARM_UP_S + STEP_S)
        settings = pipelines[grown].fleets["generate"].settings
        small = replace(settings, members=1, member=replace(settings.member, window=ADDED_WINDOW))
        processes = []
        for n in range(1, 4):
            added = FleetProcess(replace(small, instance=f"p{n}"))
            processes.append(extra.enter_context(another_process(added)))
            marks.append((f"{n + 1} processes", sampler.elapsed()))
            at = sampler.elapsed()
            sampler.until(lambda at=at: sampler.elapsed() >= at + STEP_S)
        processes[-1].kill()
        marks.append(("one killed", sampler.elapsed()))
        killed_at = sampler.elapsed()
        sampler.until(lambda: sampler.elapsed() >= killed_at + KILLED_S)
        curve = in_flight(busy(sampler.series))
        last = sampler.series[-1][1]
    steps = []
    for (label, start), end in zip(marks, [*[at for _, at in marks[1:]], sampler.series[-1][0]], strict=True):
        window = [use for at, use in curve if start + SETTLE_S <= at <= end]
        steps.append({"step": label, **{n: sum(u[n] for u in window) / max(1, len(window)) for n in WEIGHTS}})
    back = next((at for at, use in curve if at > killed_at and use[grown] >= 0.95 * due), None)
    return {"binds": "scaling", "capacity": capacity, "due": due, "steps": steps, "marks": marks,
            "over_quota": last["over_quota"], "max_in_flight": last["max_in_flight"],
            "back_after_kill_s": None if back is None else back - killed_at, "series": busy(sampler.series)}


def plot(result: dict[str, Any], path: Path) -> None:
    """Each pipeline's calls in flight over time (from the busy-seconds counter)."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    curve = in_flight(result["series"])
    for name, weight in WEIGHTS.items():
        ax.plot([at for at, _ in curve], [use[name] for _, use in curve], label=f"{name} (weight {weight:g})")
    for mark in ("idle_at", "back_at") if "idle_at" in result else ():
        ax.axvline(result[mark], color="grey", linestyle="--", linewidth=1)
    for _, at in result.get("marks", ()):
        ax.axvline(at, color="grey", linestyle="--", linewidth=1)
    ax.axvline(WARM_UP_S, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("seconds")
    ax.set_ylabel("calls in flight at the stand-in")
    ax.set_title(f"one quota of {result['capacity']:g} ({result['binds']}) shared 2 : 1 : 1")
    ax.legend()
    save(fig, path)


def report(results: list[dict[str, Any]]) -> Table:
    table = Table(title="shared quota: three pipelines, weights 2 : 1 : 1")
    for column in ("run", "share of fair (a, b, c)", "Jain", "quota used", "refused", "past quota",
                   "filled after idle", "share regained"):
        table.add_column(column)
    for r in results:
        if "p99_s" in r:
            left = ", ".join(f"{v:.3f}" for v in r["share_of_left"].values()) or "-"
            table.add_row(f"{r['binds']}: p99 {r['p99_s']:.2f} s of {r['completed']}, "
                          f"dead-lettered {r['dead_lettered']}", f"b, c of what a left: {left}", "",
                          f"{r['quota_used']:.3f}", f"{r['refused_share']:.2%}", str(r["over_quota"]), "", "")
            continue
        if "steps" in r:
            for step in r["steps"]:
                calls = ", ".join(f"{step[n]:.1f}" for n in WEIGHTS) + " calls"
                table.add_row(f"scaling: {step['step']}", calls, "", "", "", str(r["over_quota"]), "", "")
            back = r["back_after_kill_s"]
            table.add_row("scaling: share back after the kill", "", "", "", "", "", "",
                          "never" if back is None else f"{back:.1f} s")
            continue
        if "idle_s" in r:
            seconds = [f"{r[k]:.1f} s" if r[k] is not None else "never" for k in ("filled_s", "regained_s")]
            table.add_row(f"tenant_c idle {r['idle_s']:g} s", "", "", "", "", "", *seconds)
            continue
        fair = ", ".join(f"{r['share_of_fair'][n]:.3f}" for n in WEIGHTS)
        table.add_row(f"backlogged, {r['binds']} binds", fair, f"{r['weighted_jain']:.4f}",
                      f"{r['quota_used']:.3f}", f"{r['refused_share']:.2%}", str(r["over_quota"]), "", "")
    return table


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binds", default="concurrency", help="comma-separated: concurrency, requests, tokens")
    p.add_argument("--seconds", type=float, default=60.0, help="the measured window, after the warm-up")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--idle", type=float, default=0.0,
                   help="then a run with tenant_c idle this many seconds (0: none)")
    p.add_argument("--lanes", action="store_true",
                   help="then tenant_a in the interactive lane, alone and beside three times the quota")
    p.add_argument("--scaling", action="store_true",
                   help="then tenant_a's generate fleet from one process to four, then one killed")
    p.add_argument("--port", type=int, default=8650, help="the stand-in's port")
    args = p.parse_args(argv)
    stack = Stack.from_environment(os.environ)
    if stack is None:
        raise SystemExit("the stack's addresses are not set: run `make up` and source .local/dev/stack.env")
    out = RESULTS / f"shared-quota-{new_run_id('q').split('-')[1]}"
    out.mkdir(parents=True)
    results: list[dict[str, Any]] = []

    def keep(result: dict[str, Any], plot_name: str) -> None:
        """Plot a run and save every figure so far: a later run that fails loses only itself."""
        results.append(result)
        plot(result, out / plot_name)
        (out / "figures.json").write_text(json.dumps(results, indent=1))

    for binds in filter(None, args.binds.split(",")):
        keep(backlogged(stack, binds, args.seconds, args.time_scale, args.port), f"shares-{binds}.png")
    if args.lanes:
        alone, crowded = interactive_lane(stack, args.time_scale, args.port, args.seconds)
        keep(alone, "interactive-alone.png")
        keep(crowded, "interactive-crowded.png")
    if args.idle:
        keep(idle_and_return(stack, args.time_scale, args.port, args.idle), "idle-and-return.png")
    if args.scaling:
        keep(scaling(stack, args.time_scale, args.port), "scaling.png")
    Console(width=150).print(report(results))
    print(f"figures and plots in {out}")


if __name__ == "__main__":
    main()
