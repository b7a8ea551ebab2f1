"""The benchmark: the named scenarios side by side in one run on the same broker, with the same
AI stand-in limits and the same load, plus Kafka-level throughput and the pause benchmark.

    python -m bench.run                      # the full comparison at real latencies (make bench)
    python -m bench.run --scale 0.5 --burst 2560
    python -m bench.run --smoke              # small and quick: checks the output, not timings

Needs the stack (`make up`): Kafka, PostgreSQL and the AI service stand-in, whose time scale,
latencies and concurrency limit the run sets through its config endpoint. Figures are computed
from the database and Kafka (bench/figures.py); results go to results/<run-id>/.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import requests
from rich.console import Console

from bench import figures, kafka_throughput, pause_benchmark, report
from consumers import pipeline_spec, presets
from consumers.kafka_connection import KafkaAccess
from consumers.pipeline import new_run_id, remove_pipeline, running_pipeline
from consumers.pipeline_config import Endpoints

console = Console()
STATS_INTERVAL_MS = 2000


def configure_ai(base_url: str, p: presets.PresetParams) -> None:
    """Same limits for every scenario; counters reset so each scenario's are its own."""
    requests.put(f"{base_url}/v1/config", timeout=10, json=p.stand_in_settings()).raise_for_status()
    requests.post(f"{base_url}/v1/stats/reset", timeout=10).raise_for_status()


def run_scenario(name: str, p: presets.PresetParams, bench_id: str, kafka: KafkaAccess, env: dict[str, str],
                 keep_topics: bool = False) -> dict[str, Any]:
    config = replace(presets.build(name, p), stats_interval_ms=STATS_INTERVAL_MS)
    base = env["AI_SERVICE_URL"]
    configure_ai(base, p)
    endpoints = Endpoints.on(base, p.spec)
    # Worst case: every request on one partition, processed one at a time by every AI stage.
    calls_s = sum(p.spec.endpoint_of(stage).latency.mean_s for stage in p.spec.ai_stages)
    timeout_s = 60 + 1.5 * p.burst * calls_s * p.time_scale
    console.rule(f"[bold]{name}")
    with running_pipeline(config, kafka, env["DATABASE_URL"], endpoints,
                          run_id=f"{bench_id}-{name}", scenario=name, fleet_processes=True) as pipeline:
        started = time.time()
        sent = pipeline.send(p.burst, progress=True)
        counts = pipeline.wait_terminal(p.burst, timeout_s, progress=True)
        # One more statistics emission from every member: its last snapshot is written at close.
        time.sleep(1.5 * STATS_INTERVAL_MS / 1000)
    console.print(f"{name}: {counts} in {time.time() - started:.1f}s")
    result = figures.scenario_figures(env["DATABASE_URL"], kafka.default, pipeline.run_id, pipeline.topics,
                                      len(sent.request_ids), p.concurrency)
    result["ai_service"] = {k: v for k, v in requests.get(f"{base}/v1/stats", timeout=10).json().items()
                            if k in p.spec.endpoints}
    if not keep_topics:  # the rows stay in PostgreSQL; the next scenario gets an unburdened broker
        remove_pipeline(pipeline.topics, kafka)
    result["load_started"] = started
    return result


def versions() -> dict[str, str]:
    import confluent_kafka

    kafka_jar = next(iter(sorted(Path(".local/jars/kafka").glob("kafka_2.13-*.jar"))), None)
    return {"python": platform.python_version(), "confluent_kafka": metadata.version("confluent-kafka"),
            "librdkafka": confluent_kafka.libversion()[0], "pyspark": metadata.version("pyspark"),
            "kafka_broker": kafka_jar.stem.split("-", 1)[1] if kafka_jar else "unknown"}


def ratios(s: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    def ratio(a: str, b: str, key: str = "throughput_rps") -> float | None:
        if a in s and b in s and s[b][key]:
            return round(s[a][key] / s[b][key], 2)
        return None

    return {"tuned_over_baseline": ratio("tuned", "baseline"),
            "flow_over_baseline": ratio("flow", "baseline"),
            "flow_over_tuned": ratio("flow", "tuned"),
            "flow_kip848_over_flow": ratio("flow-kip848", "flow")}


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
    p.add_argument("--scenarios", default=",".join(presets.NAMES))
    p.add_argument("--perf-records", type=int, default=1_000_000)
    p.add_argument("--pause-seconds", type=float, default=10.0)
    p.add_argument("--keep-topics", action="store_true", help="keep the scenarios' topics for inspection")
    p.add_argument("--smoke", action="store_true", help="a small run that checks the output")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    if args.smoke:
        args.partitions, args.concurrency, args.flow_members = 8, 8, 2
        args.burst, args.perf_records, args.pause_seconds = 80, 50_000, 2.0
        args.scale = min(args.scale, 0.05)
    env = {k: os.environ[k] for k in ("DATABASE_URL", "AI_SERVICE_URL") if k in os.environ}
    kafka = KafkaAccess.from_environment()
    if kafka is None or len(env) < 2:
        raise SystemExit("the stack's addresses are not set: run `make up` and source .local/stack.env")
    brokers = int(os.environ.get("KAFKA_BROKERS", "1"))
    params = presets.PresetParams(partitions=args.partitions, concurrency=args.concurrency,
                                   time_scale=args.scale, burst=args.burst or 20 * args.concurrency,
                                   flow_members=args.flow_members, replication_factor=min(3, brokers),
                                   pipeline=args.pipeline)
    bench_id = new_run_id("bench")
    results = {name: run_scenario(name, params, bench_id, kafka, env, args.keep_topics)
               for name in args.scenarios.split(",")}
    console.rule("[bold]Kafka-level throughput")
    producer = kafka_throughput.compare(kafka.default, args.perf_records, 512, (1, params.partitions),
                                        params.replication_factor)
    console.rule("[bold]pause benchmark")
    pause = pause_benchmark.run(kafka.default, seconds=args.pause_seconds,
                                records_per_partition=5_000 if args.smoke else 50_000)
    summary = {
        "run_id": bench_id, "time_scale": params.time_scale, "ai_capacity_rps": params.ai_capacity_rps,
        "versions": versions(), "params": asdict(params),
        "scenarios": {n: {k: v for k, v in r.items() if k != "completion_times"}
                      for n, r in results.items()},
        "ratios": ratios(results), "producer_vs_perftest": producer, "pause_benchmark": pause,
    }
    out = report.write(summary, {n: r["completion_times"] for n, r in results.items()},
                       {n: r["load_started"] for n, r in results.items()})
    report.print_table(summary, console)
    console.print(f"results in {out} (plots: completions.png, requests_per_partition.png)")
    return out


if __name__ == "__main__":
    main()
