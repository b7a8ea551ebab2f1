"""The benchmark: the named scenarios side by side in one run, with the same AI stand-in limits
and the same load, plus Kafka-level throughput and the pause benchmark.

    python -m bench.run                      # the full comparison at real latencies (make bench)
    python -m bench.run --scale 0.5 --burst 2560
    python -m bench.run --smoke              # small and quick: checks the output, not timings

Needs the stack (`make up`): Kafka, PostgreSQL and the AI service stand-in, whose time scale,
latencies and concurrency limit the run sets through its config endpoint. The `durable`
scenario is `flow` on three brokers with RF 3, min ISR 2 and acks=all: on the main stack when
it has three brokers, else on a three-broker local stack of its own (`--durable-stack`), up for
that scenario only (`durable`). `router-peer` (bench/peer.py), run only when named, sends the
burst's requests of the pipeline's chat stage through LiteLLM's own Router client instead, held
to the gateway's limits, without Kafka: what a team gets without the platform. `flow-adaptive`
meets a limit that halves and comes back during its burst (LIMIT_SCHEDULE); the scenarios named
by `--steady` first take a steady load at STEADY_SHARE of the capacity, which measures the
platform's own overhead apart from the burst's queueing, beside how much the machine delayed a
process with no work of its own meanwhile (bench/machine_noise.py).
Each stack takes an unmeasured half burst before its first scenario, so that no scenario meets
brokers whose JVMs have not compiled their hot code yet. The scenarios run `--repeat` times,
interleaved (each once, then each again), every burst beside the machine's noise and the CPU
each kind of process spent in it (bench/process_cpu.py); each figure
and each ratio between scenarios is reported as a mean with its 95 % interval
(bench/repetitions.py).
Figures are computed from the database and Kafka (bench/figures.py); results go to
results/<run-id>/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import requests
from rich.console import Console

from bench import (
    figures,
    kafka_throughput,
    machine_noise,
    pause_benchmark,
    process_cpu,
    repetitions,
    report,
    spark_partition_load,
)
from bench.interrupt import unwind_on_sigterm
from bench.peer import PEER, run_router_peer
from bench.stacks import DURABLE_BROKERS, Stack, scenario_stack
from consumers.config import pipeline_spec, presets
from consumers.runs.pipeline_run import Pipeline, new_run_id, remove_pipeline, running_pipeline
from spark.session import session

console = Console()
STATS_INTERVAL_MS = 2000
STEADY_SHARE = 0.8  # of the AI capacity: a load the pipeline keeps up with
# flow-adaptive: the bottleneck's limit as a share of the concurrency, from a share of the time
# the burst needs at full capacity on (real-scale seconds, scaled like every other duration).
LIMIT_SCHEDULE = ((0.4, 0.5), (0.8, 1.0))


def configure_ai(base_url: str, settings: dict[str, Any]) -> None:
    """Same limits for every scenario; counters reset and budgets full, so each scenario's
    figures are its own."""
    requests.put(f"{base_url}/v1/config", timeout=10, json=settings).raise_for_status()
    requests.post(f"{base_url}/v1/stats/reset", timeout=10).raise_for_status()


def limit_schedule(p: presets.PresetParams) -> list[list[float]]:
    """flow-adaptive's `limit_schedule` for the bottleneck endpoint (see LIMIT_SCHEDULE)."""
    full_s = p.burst / (p.concurrency / p.slowest_call_s)
    return [[round(share * full_s, 3), max(1, round(limit * p.concurrency))]
            for share, limit in LIMIT_SCHEDULE]


@dataclass(frozen=True)
class ScenarioResult:
    """A scenario's figures, as summary.json holds them, and the completions its plots draw."""

    figures: dict[str, Any]
    completion_times: list[float]
    load_started: float

    @classmethod
    def of(cls, found: Mapping[str, Any]) -> ScenarioResult:
        """What a scenario's run found, its series apart."""
        return cls({k: v for k, v in found.items() if k not in ("completion_times", "load_started")},
                   found["completion_times"], found["load_started"])


@dataclass
class Bench:
    """What the scenarios of one run share: its parameters and id, the main stack, the stacks
    warmed so far, and what the command line asked of them."""

    params: presets.PresetParams
    bench_id: str
    main: Stack
    durable_stack: str  # the local stack started for a scenario that needs more brokers
    steady: frozenset[str]  # the scenarios that first take a steady load
    keep_topics: bool
    peer_requests: int  # 0: the burst
    warmed: set[str] = field(default_factory=set)  # the main stack's bootstrap once warmed

    def run_id(self, name: str, repetition: int) -> str:
        """The run id of one scenario's repetition (counted from 1)."""
        return f"{self.bench_id}-{name}-{repetition}"


@dataclass(frozen=True)
class Scenario:
    """A pipeline scenario: the preset it deploys, the brokers it needs (on a main stack of
    fewer, it runs on a local stack of its own) and whether its bottleneck's limit follows
    LIMIT_SCHEDULE during the burst."""

    name: str
    preset: str
    brokers: int = 1
    moving_limit: bool = False

    def schedule(self, p: presets.PresetParams) -> list[list[float]]:
        """The bottleneck's `limit_schedule` over the burst (empty: the limit holds)."""
        return limit_schedule(p) if self.moving_limit else []

    def run(self, bench: Bench, repetition: int) -> ScenarioResult:
        with scenario_stack(self.brokers, bench.main, bench.durable_stack) as where:
            p = replace(bench.params, replication_factor=min(3, where.brokers))
            # a stack started for this scenario alone has new JVMs at every repetition
            if where is not bench.main or where.kafka.bootstrap not in bench.warmed:
                warm_up(p, bench.run_id(f"warm-up-{where.brokers}", repetition), where)
                bench.warmed.add(where.kafka.bootstrap)
            return ScenarioResult.of(run_scenario(self, p, bench.run_id(self.name, repetition), where,
                                                  self.name in bench.steady, bench.keep_topics))


@dataclass(frozen=True)
class RouterPeer:
    """The peer (bench/peer.py): the burst's requests of the chat stage through LiteLLM's Router,
    straight to the stand-in, without Kafka."""

    name: str = PEER

    def run(self, bench: Bench, repetition: int) -> ScenarioResult:
        console.rule(f"[bold]{self.name} {repetition}")
        configure_ai(bench.main.ai_url, bench.params.stand_in_settings())
        p = bench.params
        return ScenarioResult.of(run_router_peer(p.spec, bench.main.ai_url, bench.peer_requests or p.burst,
                                                 p.concurrency, bench.run_id(self.name, repetition)))


# Every preset is a scenario of its name; `durable` is `flow` on three brokers.
SCENARIOS = {name: Scenario(name, name) for name in presets.NAMES} | {
    "flow-adaptive": Scenario("flow-adaptive", "flow-adaptive", moving_limit=True),
    "durable": Scenario("durable", "flow", brokers=DURABLE_BROKERS)}
CHOICES: dict[str, Scenario | RouterPeer] = {**SCENARIOS, PEER: RouterPeer()}  # the peer only when named


def steady_phase(pipeline: Pipeline, p: presets.PresetParams, timeout_s: float,
                 gateway: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """STEADY_SHARE of the capacity through the running pipeline under a run id of its own."""
    count = max(10, p.burst // 2)
    steady = replace(pipeline, run_id=f"{pipeline.run_id}-steady")
    console.print(f"steady phase: {count} requests at {STEADY_SHARE * p.ai_capacity_rps:.1f}/s")
    with machine_noise.measured() as noise:
        sent = steady.send(count, rate=STEADY_SHARE * p.ai_capacity_rps, progress=True)
        steady.wait_terminal(count, timeout_s, progress=True)
    return {"rate_rps": round(STEADY_SHARE * p.ai_capacity_rps, 3),
            **figures.phase_figures(pipeline.database_url, steady.run_id, pipeline.topics,
                                    len(sent.request_ids), p.concurrency, sent.per_partition(p.partitions),
                                    limits=figures.bench_limits(p, gateway=gateway)),
            **noise.figures}


def burst_timeout_s(p: presets.PresetParams) -> float:
    """Worst case: every request on one partition, processed one at a time by every AI stage."""
    calls_s = sum(p.spec.endpoint_of(stage).latency.mean_s for stage in p.spec.ai_stages)
    return 60 + 1.5 * p.burst * calls_s * p.time_scale


def warm_up(p: presets.PresetParams, run_id: str, stack: Stack) -> None:
    """Half a burst of `flow` through a stack before its first scenario, measured by no one: a
    broker's first minutes of traffic run on code its JVM has not compiled yet
    (docs/benchmarks.md#the-scenarios)."""
    warm = replace(p, burst=max(10, p.burst // 2))
    configure_ai(stack.ai_url, warm.stand_in_settings())
    console.rule(f"[bold]warm-up of {stack.kafka.bootstrap}")
    with running_pipeline(presets.build("flow", warm), stack.kafka, stack.database_url,
                          stack.endpoints(warm.spec), run_id=run_id,
                          scenario="warm-up", fleet_processes=True) as pipeline:
        pipeline.send(warm.burst, progress=True)
        pipeline.wait_terminal(warm.burst, burst_timeout_s(warm), progress=True)
    remove_pipeline(pipeline.topics, stack.kafka)


def run_scenario(scenario: Scenario, p: presets.PresetParams, run_id: str, stack: Stack,
                 steady: bool = False, keep_topics: bool = False) -> dict[str, Any]:
    name = scenario.name
    config = replace(presets.build(scenario.preset, p), stats_interval_ms=STATS_INTERVAL_MS)
    schedule = scenario.schedule(p)
    configure_ai(stack.ai_url, p.stand_in_settings())
    endpoints = stack.endpoints(p.spec)
    timeout_s = burst_timeout_s(p)
    console.rule(f"[bold]{run_id}")
    result: dict[str, Any] = {}
    with running_pipeline(config, stack.kafka, stack.database_url, endpoints,
                          run_id=run_id, scenario=name, fleet_processes=True) as pipeline:
        if steady:
            result["steady"] = steady_phase(pipeline, p, timeout_s, stack.gateway_budgets(p))
            configure_ai(stack.ai_url, p.stand_in_settings())  # the burst's counters are its own
        if schedule:
            configure_ai(stack.ai_url, {p.bottleneck: {"limit_schedule": schedule}})
        schedule_at = time.time()
        with machine_noise.measured() as noise, process_cpu.measured() as spent:
            sent = pipeline.send(p.burst, progress=True)
            counts = pipeline.wait_terminal(p.burst, timeout_s, progress=True)
        # One more statistics emission from every member: its last snapshot is written at close.
        time.sleep(1.5 * STATS_INTERVAL_MS / 1000)
    console.print(f"{name}: {counts} in {time.time() - schedule_at:.1f}s")
    # The stand-in's own counters first: the capacity's tokens per call and its check come from them.
    served = requests.get(f"{stack.ai_url}/v1/stats", timeout=10).json()
    result["ai_service"] = {k: v for k, v in served.items() if k in p.spec.endpoints}
    result.update(figures.scenario_figures(stack.database_url, stack.kafka.default, pipeline.run_id,
                                           pipeline.topics, len(sent.request_ids), p.concurrency,
                                           sent.per_partition(p.partitions),
                                           limits=figures.bench_limits(p, result["ai_service"],
                                                                       stack.gateway_budgets(p))))
    through = stack.through_gateway(p.spec)
    by_gateway = [s for s in p.spec.ai_stages if p.spec.stages[s].work.endpoint in through]
    result.update(figures.limit_figures(
        result, p, [(0.0, p.concurrency), *schedule], schedule_at, stack.gateway_budgets(p),
        figures.refused_at_client(stack.database_url, pipeline.run_id, by_gateway) if by_gateway else 0))
    result["overload_by_endpoint"] = figures.overload_by_endpoint(stack.database_url, pipeline.run_id, p.spec)
    if schedule:
        result["adaptive"] = figures.adaptive_figures(stack.database_url, pipeline.run_id, result, p,
                                                      schedule, schedule_at, stack.gateway_budgets(p))
    if not keep_topics:  # the rows stay in PostgreSQL; the next scenario gets an unburdened broker
        remove_pipeline(pipeline.topics, stack.kafka)
    result["brokers"] = stack.brokers
    result["machine"] = noise.figures
    result["cpu_s"] = spent.cpu_s
    result["load_started"] = schedule_at
    return result


def versions() -> dict[str, str]:
    import confluent_kafka

    kafka_jar = next(iter(sorted(Path(".local/jars/kafka").glob("kafka_2.13-*.jar"))), None)
    return {"python": platform.python_version(), "confluent_kafka": metadata.version("confluent-kafka"),
            "librdkafka": confluent_kafka.libversion()[0], "pyspark": metadata.version("pyspark"),
            "kafka_broker": kafka_jar.stem.split("-", 1)[1] if kafka_jar else "unknown"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=float(os.environ.get("SCALE", "1")),
                   help="time scale of AI latencies and Kafka group timeouts (1 = real, the default: "
                        "at smaller scales the platform's own per-request work weighs against "
                        "shorter AI calls)")
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=64, help="per AI endpoint")
    p.add_argument("--burst", type=int, default=0, help="requests (default 20 x concurrency)")
    p.add_argument("--flow-members", type=int, default=4)
    p.add_argument("--pipeline", default=pipeline_spec.REFERENCE, help="the pipeline spec to benchmark")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"comma list of {', '.join(SCENARIOS)}, and {PEER} (a pipeline with a chat stage)")
    p.add_argument("--peer-requests", type=int, default=0,
                   help=f"requests {PEER} sends (default the burst): enough to outlast a minute of its "
                        "model's budget, which may not bind the pipeline")
    p.add_argument("--stand-in", type=json.loads, default={}, metavar="JSON",
                   help='stand-in settings per endpoint over the spec\'s, e.g. a budget that binds: '
                        '\'{"summarize": {"requests_per_minute": 1800, "retry_after_on_budget": false}}\'')
    p.add_argument("--steady", default="flow", help="scenarios that first take a steady load (comma list)")
    p.add_argument("--durable-stack", default="durable",
                   help="the local stack (STACK name) started for `durable` when the main one has one broker")
    p.add_argument("--perf-records", type=int, default=1_000_000)
    p.add_argument("--pause-seconds", type=float, default=10.0)
    p.add_argument("--spark-records", type=int, default=10_000_000,
                   help="records partition_load reads beside ConsumerPerformance (0: skip)")
    p.add_argument("--spark-repeat", type=int, default=3,
                   help="runs of partition_load (and of its --distinct-keys variant, alternated) and of "
                        "ConsumerPerformance; the best of each is compared")
    p.add_argument("--repeat", type=int, default=None,
                   help="repetitions of every scenario, interleaved (each scenario once, then again): "
                        "figures and ratios are reported as means with 95 %% intervals (default 3; "
                        "1 with --smoke)")
    p.add_argument("--keep-topics", action="store_true", help="keep the scenarios' topics for inspection")
    p.add_argument("--smoke", action="store_true", help="a small run that checks the output")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    if args.smoke:
        args.partitions, args.concurrency, args.flow_members = 8, 8, 2
        args.burst, args.perf_records, args.pause_seconds = 80, 50_000, 2.0
        args.spark_records, args.spark_repeat = min(args.spark_records, 100_000), 1
        args.scale = min(args.scale, 0.05)
    args.repeat = args.repeat or (1 if args.smoke else 3)
    names = args.scenarios.split(",")
    unknown = [n for n in names if n not in CHOICES]
    if unknown:
        raise SystemExit(f"unknown scenarios {unknown}; choose from {list(CHOICES)}")
    if args.repeat < 1:
        raise SystemExit("--repeat is at least 1")
    main_stack = Stack.from_environment(os.environ)
    if main_stack is None:
        raise SystemExit("the stack's addresses are not set: run `make up` and source "
                         ".local/<stack>/stack.env")
    params = presets.PresetParams(partitions=args.partitions, concurrency=args.concurrency,
                                  time_scale=args.scale, burst=args.burst or 20 * args.concurrency,
                                  flow_members=args.flow_members, pipeline=args.pipeline,
                                  endpoint_settings=args.stand_in)
    bench = Bench(params, new_run_id("bench"), main_stack, args.durable_stack,
                  frozenset(args.steady.split(",")) if args.steady else frozenset(), args.keep_topics,
                  args.peer_requests)
    runs = [{name: CHOICES[name].run(bench, repetition) for name in names}
            for repetition in range(1, args.repeat + 1)]
    rf = min(3, main_stack.brokers)
    console.rule("[bold]Kafka-level throughput")
    producer = kafka_throughput.compare(main_stack.kafka.default, args.perf_records, 512,
                                        (1, params.partitions), rf)
    console.rule("[bold]pause benchmark")
    pause = pause_benchmark.run(main_stack.kafka.default, seconds=args.pause_seconds,
                                records_per_partition=5_000 if args.smoke else 50_000)
    spark = None
    if args.spark_records:
        console.rule("[bold]Spark partition_load against ConsumerPerformance")
        with session(spark_partition_load.APP_NAME, long_scan=True) as spark_session:
            spark = spark_partition_load.measure(main_stack.kafka.default, spark_session, args.spark_records,
                                                 partitions=params.partitions, replication=rf,
                                                 workload=spark_partition_load.Workload(repeat=args.spark_repeat))
    measured = [{n: r.figures for n, r in run.items()} for run in runs]
    summary = {
        "run_id": bench.bench_id, "time_scale": params.time_scale, "ai_capacity_rps": params.ai_capacity_rps,
        "versions": versions(), "params": {**asdict(params), "replication_factor": rf},
        "repeat": args.repeat, "repetitions": measured,
        "scenarios": repetitions.scenario_figures(measured), "ratios": repetitions.comparisons(measured),
        "producer_vs_perftest": producer,
        "pause_benchmark": pause,
        "spark_partition_load": spark,
    }
    out = report.write(summary, [{n: r.completion_times for n, r in run.items()} for run in runs],
                       [{n: r.load_started for n, r in run.items()} for run in runs])
    report.print_table(summary, console)
    adaptive = any("adaptive" in r.figures for r in runs[0].values())
    console.print(f"results in {out} (plots: completions.png, ratios.png, requests_per_partition.png"
                  f"{', adaptive.png' if adaptive else ''})")
    return out


if __name__ == "__main__":
    unwind_on_sigterm()
    main()
