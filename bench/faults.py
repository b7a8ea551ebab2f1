"""Fault injection: the pipeline under steady load while the harness breaks one thing at a time.

    python -m bench.faults                          # every fault (make faults: a stack of its own)
    python -m bench.faults --faults broker-kill,oversize

Each fault gets a fresh run of its own: bench/fault_injection.py injects and undoes it,
bench/fault_figures.py measures it and judges the phase. The run writes
results/<run id>/faults.json and faults.png and exits 1 when any fault fails. The faults, the
set-up and why it is this one, the figures and what fails a fault: docs/faults.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import requests
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from bench import fault_pipeline, fault_report
from bench.fault_figures import PhaseRun, collect, verdict
from bench.fault_fleets import SupervisedFleets, remove_leftovers
from bench.fault_injection import FAULTS, Fault, Target, configure_ai
from bench.fault_record import FaultRun, Injection, Load, PhaseFigures, PhaseRecord
from bench.interrupt import unwind_on_sigterm
from bench.report import run_dir
from consumers.config import events, pipeline_spec, presets
from consumers.config.candidate import Endpoints, PipelineConfig
from consumers.config.kafka_connection import KafkaAccess, KafkaConnection
from consumers.runs.pipeline_run import Pipeline, new_run_id, provision_pipeline, remove_pipeline
from consumers.runtime.storage import Storage
from host import supervisor
from infra import kafka_cluster
from infra.layout import Layout, current
from infra.stack import StackState
from infra.supervisor import stack_paths

console = Console()
FLEET_ENV = ("DATABASE_URL", "AI_SERVICE_URL")
SERVICE_QUIET_S = 120.0  # the longest wait for the AI service's calls in flight (hangs) to end
SOURCE_EXIT_S = 60.0  # a source still running this long after its last scheduled send is stopped


@dataclass(frozen=True)
class Settings:
    """The run's shape (docs/faults.md#the-set-up says why)."""

    time_scale: float = 0.25
    concurrency: int = 16  # per AI endpoint
    partitions: int = 16
    members: int = 4  # per AI stage
    load_share: float = 0.88  # of the AI capacity
    pre_s: float = 20.0  # load before the fault
    post_s: float = 25.0  # load after the fault's planned end
    baseline_s: float = 15.0  # the pre-fault rate is measured over the last seconds before it
    window_s: float = 5.0  # recovery: completions counted over this window
    drain_s: float = 90.0  # after the load, how long to wait for every request to settle
    preset: str = "flow-exactly-once"

    @property
    def params(self) -> presets.PresetParams:
        return presets.PresetParams(partitions=self.partitions, concurrency=self.concurrency,
                                    time_scale=self.time_scale, flow_members=self.members,
                                    replication_factor=3)

    @property
    def capacity_rps(self) -> float:
        return self.params.ai_capacity_rps

    @property
    def load_rps(self) -> float:
        return round(self.load_share * self.capacity_rps, 2)

    def config(self, pipeline: str = pipeline_spec.REFERENCE) -> PipelineConfig:
        config = presets.build(self.preset, replace(self.params, pipeline=pipeline))
        if config.profile != "durability":
            raise RuntimeError(f"the {self.preset} preset runs the {config.profile} profile; "
                               "faults need durability")
        return config


def heal_ai(ai_url: str, s: Settings) -> None:
    """The AI service as every phase starts: the scaled reference latencies, no faults."""
    healthy = {"limit": s.concurrency, "error_rate": 0.0, "hang_rate": 0.0, "rate_limit_rps": None,
               "distribution": "fixed"}
    configure_ai(ai_url, {"time_scale": s.time_scale,
                          **{name: {**healthy, "latency_s": e.latency.median_s}
                             for name, e in s.params.spec.endpoints.items()}})


def start_source(kafka: KafkaConnection, pipeline: str, run_id: str, rate: float, duration_s: float,
                 log: Path, report: Path) -> subprocess.Popen[str]:
    """The load: consumers.loadgen.source in a process of its own, at a steady rate, UUID keys, running
    as `kafka`'s principal (given in its environment, never on its command line). Its report
    goes to a file, not a pipe: one read only after the source exits would fill the pipe's
    64 KiB with the request ids of a load over ~100 s, and the source would block on it."""
    cmd = [sys.executable, "-m", "consumers.loadgen.source", "--pipeline", pipeline, "--prefix", run_id,
           "--run-id", run_id, "--rate", str(rate), "--duration", str(duration_s), "--keys", "uuid",
           "--profile", "durability", "--json", "--quiet"]
    with open(log, "a") as err, open(report, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=kafka.child_environment())


class Phase:
    """One fault on a fresh run: set up, load, inject, drain, measure, tear down."""

    def __init__(self, fault: Fault, s: Settings, kafka: KafkaAccess, env: dict[str, str], layout: Layout,
                 client: supervisor.Client, run_id: str, out: Path,
                 say: Callable[[str, float | None], None]) -> None:
        self.fault, self.s, self.kafka, self.env, self.layout, self.out = fault, s, kafka, env, layout, out
        self.run_id = run_id
        self.config = s.config(fault.pipeline)
        self.topics = events.Topics(run_id, self.config.spec)
        fleet_env = {"DATABASE_URL": env["DATABASE_URL"],
                     **Endpoints.on(env["AI_SERVICE_URL"], self.config.spec).environment()}
        self.fleets = SupervisedFleets(client, run_id, self.config, kafka, fleet_env)
        self.pipeline = Pipeline(run_id, self.topics, self.config, kafka, env["DATABASE_URL"])
        self._say = say
        self.load_started = 0.0

    @property
    def source_report(self) -> Path:
        return self.out / f"source-{self.fault.name}.json"

    def say(self, step: str) -> None:
        elapsed = time.time() - self.load_started if self.load_started else None
        self._say(f"{self.fault.name}: {step}", elapsed)

    def run(self) -> PhaseRecord:
        record = self.fault.record(self.run_id, self.config)
        source: subprocess.Popen[str] | None = None
        try:
            self.prepare()
            started = self.fleet_pids()
            source = self.load()
            record.injection = injection = self.inject()
            record.load = load = self.finish_load(source, injection)
            self.drain(load.produced)
            ended = self.fleet_pids()
            record.fleet_pids = {s: {"start": pid, "end": ended[s]} for s, pid in started.items()}
            self.fleets.stop()
            self._finish_run()
            record.figures = self.figures(load, injection)
        except Exception as exc:  # noqa: BLE001 - one fault that cannot run must not stop the others
            record.error = f"{exc.__class__.__name__}: {exc}"
            console.print(f"[red]{self.fault.name}: {record.error}")
        finally:
            if source is not None and source.poll() is None:
                source.terminate()
                source.wait(30)
            self.teardown()
        record.failures = verdict(record)
        return record

    def fleet_pids(self) -> dict[str, int]:
        """Each stage's fleet process id, as supervisord has it (0: none running)."""
        return {stage: self.fleets.pid(stage) for stage in self.config.spec.stage_names}

    def prepare(self) -> None:
        """Every broker up, fresh topics, the run row, the AI service healed, fleets stable."""
        state = StackState.load(self.layout)
        self.say("waiting for every broker")
        kafka_cluster.wait_registered(self.layout, state.kafka, state.brokers)
        self.say("provisioning topics")
        provision_pipeline(self.config, self.topics, self.kafka)
        storage = Storage(self.env["DATABASE_URL"], pool_size=1)
        try:
            storage.start_run(self.run_id, f"faults:{self.fault.name}", self.config.to_dict())
        finally:
            storage.close()
        heal_ai(self.env["AI_SERVICE_URL"], self.s)
        self.say("starting the fleets under supervisord")
        self.fleets.start()
        self.fleets.wait_stable()
        requests.post(f"{self.env['AI_SERVICE_URL']}/v1/stats/reset", timeout=10).raise_for_status()

    def _finish_run(self) -> None:
        """The run's end time, as every run the platform drives records it."""
        storage = Storage(self.env["DATABASE_URL"], pool_size=1)
        try:
            storage.finish_run(self.run_id)
        finally:
            storage.close()

    def load(self) -> subprocess.Popen[str]:
        """Start the steady load and let it run up to the fault."""
        duration = self.s.pre_s + self.fault.planned_s + self.s.post_s
        source = start_source(self.kafka.of("source"), self.fault.pipeline, self.run_id, self.s.load_rps,
                              duration, self.out / f"source-{self.fault.name}.log", self.source_report)
        self.load_started = time.time()
        while (left := self.load_started + self.s.pre_s - time.time()) > 0:
            self.say(f"steady load, fault in {left:.0f} s")
            time.sleep(min(1.0, left))
        return source

    def inject(self) -> Injection:
        """The fault, in force for as long as it lasts (the load goes on in its own process)."""
        target = Target(self.layout, self.kafka.default, self.env["AI_SERVICE_URL"],
                        self.run_id, self.config, self.fleets, self.s.load_rps, self.say)
        return self.fault.inject(target)

    def finish_load(self, source: subprocess.Popen[str], injection: Injection) -> Load:
        """The load's end is its schedule's (the source may take longer to exit); what the source
        says it sent, and what Kafka holds without the fault's own records: the figures count
        what Kafka holds."""
        ended = self.load_started + self.s.pre_s + self.fault.planned_s + self.s.post_s
        while source.poll() is None and time.time() < ended + SOURCE_EXIT_S:
            self.say("load after the fault" if time.time() < ended else "waiting for the source to exit")
            time.sleep(1.0)
        acked, error = None, None
        if source.poll() is None:
            source.terminate()
            error = (f"still running {SOURCE_EXIT_S:.0f} s after its last scheduled send, "
                     f"terminated: see source-{self.fault.name}.log")
        source.wait(30)
        if source.returncode == 0:
            acked = len(json.loads(self.source_report.read_text())["request_ids"])
        elif error is None:
            error = f"exit code {source.returncode}: see source-{self.fault.name}.log"
        if error is not None:
            console.print(f"[yellow]{self.fault.name}: load source: {error}")
        measured = self.topics.name(self.config.spec.load.measure)
        produced = sum(self.kafka.default.partition_counts(measured)) - injection.on(measured)
        return Load(self.load_started, ended, produced, acked, error)

    def drain(self, produced: int) -> None:
        deadline = time.monotonic() + self.s.drain_s
        while time.monotonic() < deadline:
            try:
                settled = self.pipeline.settled()
            except Exception as exc:  # noqa: BLE001 - shown, and waited out like any slow drain
                settled, note = -1, f" ({exc.__class__.__name__})"
            else:
                note = ""
            if settled >= produced:
                return
            self.say(f"draining: {max(settled, 0)} of {produced} settled{note}")
            time.sleep(1.0)

    def figures(self, load: Load, injection: Injection) -> PhaseFigures:
        self.say("computing figures")
        phase = PhaseRun(self.run_id, load, injection, self.s.concurrency, self.fault.allowed_dead_letters,
                         self.fault.pipeline, self.fault.poison)
        stats = self.service_stats()
        return collect(self.env["DATABASE_URL"], self.kafka.default, phase, stats,
                       self.s.baseline_s, self.s.window_s)

    def service_stats(self) -> dict[str, Any]:
        """The AI service's counters once it has no call in flight: a try the client abandoned at
        its timeout is served, and billed, when its hang ends, after our rows counted it."""
        deadline = time.monotonic() + SERVICE_QUIET_S
        while True:
            stats = requests.get(f"{self.env['AI_SERVICE_URL']}/v1/stats", timeout=10).json()
            busy = sum(e["in_flight"] for e in stats.values() if isinstance(e, dict) and "in_flight" in e)
            if not busy or time.monotonic() > deadline:
                return stats
            self.say(f"waiting for the AI service's {busy} calls in flight")
            time.sleep(0.5)

    def teardown(self) -> None:
        """Fleets stopped (again, harmlessly), the topics and their grants deleted; the rows stay."""
        self.say("tearing down")
        for step in (self.fleets.stop, lambda: remove_pipeline(self.topics, self.kafka)):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - reported; the next phase starts clean anyway
                console.print(f"[yellow]{self.fault.name}: teardown: {exc}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", default=",".join(f.name for f in FAULTS),
                   help=f"comma-separated, from: {', '.join(f.name for f in FAULTS)}")
    p.add_argument("--preset", default=Settings.preset, choices=("flow-exactly-once", "flow"),
                   help="the configuration under test (default %(default)s)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    by_name = {f.name: f for f in FAULTS}
    unknown = [n for n in args.faults.split(",") if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown faults {unknown}; choose from {list(by_name)}")
    faults = [by_name[name] for name in args.faults.split(",")]
    env = {k: os.environ[k] for k in FLEET_ENV if k in os.environ}
    kafka = KafkaAccess.from_environment()
    if kafka is None or len(env) < len(FLEET_ENV) or int(os.environ.get("KAFKA_BROKERS", "1")) < 3:
        raise SystemExit("needs a three-broker stack's addresses: `make faults` starts one "
                         "(STACK=faults python -m infra.stack up --brokers 3; source its stack.env)")
    layout, s = current(), Settings(preset=args.preset)
    run_id = new_run_id("faults")
    out = run_dir(run_id)
    if any(fault.pipeline not in pipeline_spec.available() for fault in faults):
        # the harness, the source and the fleets (pipeline_ops.fleets.program passes it on) all read it
        os.environ["PIPELINES_DIR"] = str(fault_pipeline.write_folder(out / "pipelines"))
    paths = stack_paths(layout)
    started_supervisord = not supervisor.Client(paths).alive()
    client = supervisor.start(paths)
    for name in remove_leftovers(client):
        console.print(f"[yellow]removed {name}, left running by an earlier fault run")
    phases: list[PhaseRecord] = []
    console.print(f"fault run {run_id}: load {s.load_rps} rps against an AI capacity of "
                  f"{s.capacity_rps:.1f} rps (time scale {s.time_scale}, {s.concurrency} calls per endpoint)")
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            overall = progress.add_task("faults", total=len(faults))
            for fault in faults:
                total = s.pre_s + fault.planned_s + s.post_s
                task = progress.add_task(fault.name, total=total)

                def say(text: str, elapsed: float | None, task: Any = task, total: float = total) -> None:
                    progress.update(task, description=text,
                                    completed=min(elapsed, total) if elapsed is not None else 0)

                running = Phase(fault, s, kafka, env, layout, client, f"{run_id}-{fault.name}", out, say)
                phases.append(running.run())
                progress.update(task, completed=total,
                                description=f"{fault.name}: {'pass' if not phases[-1].failures else 'FAIL'}")
                progress.advance(overall)
    finally:
        if started_supervisord:
            supervisor.shutdown(paths)
    run = FaultRun(run_id, s.time_scale, round(s.capacity_rps, 2), s.load_rps, asdict(s),
                   s.config().to_dict(), phases)
    folder = fault_report.write(run)
    fault_report.print_table(run, console)
    for fault, phase in zip(faults, phases, strict=True):
        if (note := fault.closing_note(phase)) is not None:
            console.print(note)
    console.print(f"results in {folder} (faults.json, faults.png)")
    return 0 if run.passed else 1


if __name__ == "__main__":
    unwind_on_sigterm()
    sys.exit(main())
