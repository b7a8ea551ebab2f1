"""The peer beside the platform (`router-peer` in bench.run): a pipeline's chat stage sent
through LiteLLM's own Router client, held to the gateway's limits, straight to the stand-in.

    python -m bench.peer --pipeline support_tickets --count 1280 --ai-url http://127.0.0.1:8600

The requests are the ones the platform's scenarios send: the load generator's events with the
load source's seed, rendered by the stage's work (`HttpWork.payload`). The stage is the first
entry stage whose work is an `openai_chat` call (support_tickets' triage, on small-model): a
stage fed by another stage gets events only the platform makes. Its model's deployment is the
gateway's (`infra.ai_gateway.config`: its rpm and tpm) pointed at the stand-in, and
bench/router_peer.py sends them from the gateway's environment with one worker per call the
endpoint takes at once (the run's concurrency).

The figures are measure.figures' standard ones over the requests the peer answered, as one
stage of one endpoint: a request Router gave up on (rate-limited after its retries, or an error)
counts as dead-lettered (failed for good, and recorded), its refused tries as 429s. Router's limits
count per clock minute, so the capacity's minute is 60 wall-clock seconds whatever the run's
time scale, and their fixed windows may pass two minutes' budget at once (measure.capacity); a
call's time is its last try's, without the waits before it. Latency is from the start of the
run (the whole burst is handed over at once, as the platform's is produced).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import requests
from rich.console import Console
from rich.progress import Progress

from bench import figures as bench_figures
from consumers.config import pipeline_spec
from consumers.config.pipeline_spec import HttpWork, PipelineSpec
from consumers.loadgen import source
from infra import ai_gateway
from measure import capacity, figures

PEER = "router-peer"
REPO = Path(__file__).resolve().parent.parent
RETRIES = 3  # tries again after a rate-limit refusal (bench/router_peer.py)


def chat_stage(spec: PipelineSpec) -> str:
    """The stage the peer sends (see the module docstring)."""
    for name in spec.entry_stages:
        work = spec.stages[name].work
        if isinstance(work, HttpWork) and work.protocol == "openai_chat":
            return name
    raise ValueError(f"{PEER}: {spec.name} has no stage fed by its load that makes an openai_chat call")


def chat_requests(spec: PipelineSpec, stage: str, count: int, run_id: str) -> list[dict[str, Any]]:
    """The stage's first `count` requests as the load source makes them, rendered."""
    generator = pipeline_spec.resolve(spec.load.generator)
    rng = random.Random(source.SEED)
    topic, work = spec.stages[stage].source, spec.stages[stage].work
    rendered = []
    for index in range(count):
        event = next(e for t, e in generator(rng, run_id, index, 0.0) if t == topic)
        rendered.append(work.payload(event, spec.key, spec.endpoint_of(stage).model))
    return rendered


def gateway_model(name: str) -> ai_gateway.Model:
    found = [m for m in ai_gateway.MODELS if m.name == name]
    if not found:
        raise ValueError(f"{PEER}: the gateway has no limits for model {name!r} (infra.ai_gateway.MODELS)")
    return found[0]


def send(chat: list[dict[str, Any]], model: ai_gateway.Model, ai_url: str, workers: int,
         retries: int = RETRIES, at_minute: bool = False) -> dict[str, Any]:
    """bench/router_peer.py over `chat` in the gateway's environment, its progress shown; its result.
    `at_minute`: the requests start when a clock minute turns, once LiteLLM is loaded."""
    python = ai_gateway.VENV / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"LiteLLM is not installed at {ai_gateway.VENV}: run `make gateway-venv`")
    env = {**ai_gateway.litellm_environment(os.environ.get(ai_gateway.UPSTREAM_KEY_ENV)),
           "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory(prefix="router-peer-") as folder:
        files = {name: Path(folder) / f"{name}.json" for name in ("requests", "models", "out")}
        files["requests"].write_text(json.dumps(chat))
        files["models"].write_text(json.dumps(ai_gateway.config(ai_url, [model])["model_list"]))
        command = [str(python), "-m", "bench.router_peer", f"--workers={workers}", f"--retries={retries}",
                   *(f"--{name}={path}" for name, path in files.items()),
                   *(["--at-minute"] if at_minute else [])]
        with (subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True) as process,
              Progress(transient=True, console=Console(stderr=True)) as bar):
            task = bar.add_task(f"{PEER}: requests through LiteLLM's Router", total=len(chat))
            for line in process.stdout or ():
                done = json.loads(line)
                bar.update(task, completed=done["done"],
                           description=f"{PEER}: {done['ok']} answered, {done['refused']} refused")
        if process.returncode != 0:
            raise RuntimeError(f"bench.router_peer exited with {process.returncode} (its errors above)")
        return json.loads(files["out"].read_text())


def peer_figures(result: Mapping[str, Any], stage: str, endpoint: str, model: ai_gateway.Model,
                 served: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """measure.figures' standard figures of the peer's run (see the module docstring), beside
    the stand-in's own counters of the endpoint (`served`: its /v1/stats entry)."""
    records, totals, started = result["requests"], result["totals"], result["started"]
    served = served or {}
    ok = [r for r in records if r["outcome"] == "ok"]
    tokens = capacity.tokens_per_call("total", len(ok), sum(r["tokens_input"] for r in ok),
                                      sum(r["tokens_output"] for r in ok))
    limits = capacity.Limits({endpoint: capacity.fixed_periods(
                                 capacity.EndpointLimits(result["workers"], model.rpm, model.tpm), 1.0)},
                             {stage: endpoint}, tokens_per_call={endpoint: tokens} if tokens else {})
    service_s = {stage: statistics.fmean(r["call_s"] for r in ok)} if ok else {}
    times = [r["ended"] for r in ok]
    band = figures.steady_band(times)
    latency = [r["ended"] - started for r in ok]
    standard = figures.run_figures(
        produced=totals["requests"], status={"completed": len(ok), "dead_lettered": len(records) - len(ok)},
        span=figures.span_s(started, max((r["ended"] for r in records), default=None)),
        steady_throughput_rps=figures.steady_rate(times), service_s=service_s, ai_limit=result["workers"],
        ok_calls={stage: len(ok)},
        band_work=capacity.band_work([(stage, r["ended"] - r["call_s"], r["ended"]) for r in ok], band),
        band=band, duplicate_ai_calls=served.get("duplicate_served", 0), skew_max_over_mean=None,
        skew_cv=None, latency_s={q: figures.percentile(latency, q) for q in figures.QUANTILES}, limits=limits)
    calls = standard["calls_per_request"]
    cap = capacity.capacity(limits, service_s, calls)
    overload = bench_figures.overload_entry(totals["refused_429"], totals["calls"])
    return {**standard, **overload, "overload_by_endpoint": {endpoint: overload},
            "served_on_binding": capacity.served_check(cap, calls, limits, served.get("served"),
                                                       standard["span_s"]),
            "peer": {"stage": stage, "model": model.name, "rpm": model.rpm, "tpm": model.tpm,
                     "workers": result["workers"], "retries": result["retries"],
                     "outcomes": {k: totals[k] for k in ("ok", "rate_limited", "error")}},
            "ai_service": {endpoint: dict(served)} if served else {},
            "first_produced_s": started, "load_started": started, "completion_times": times}


def run_router_peer(spec: PipelineSpec, ai_url: str, count: int, workers: int, run_id: str) -> dict[str, Any]:
    """The peer over `count` requests of the spec's chat stage against the stand-in at `ai_url`
    (whose counters the caller has reset): its figures."""
    stage = chat_stage(spec)
    endpoint = spec.stages[stage].work.endpoint
    chat = chat_requests(spec, stage, count, run_id)
    model = gateway_model(chat[0]["model"])  # the work's model, else its endpoint's
    result = send(chat, model, ai_url, workers)
    served = requests.get(f"{ai_url}/v1/stats", timeout=10).json().get(endpoint)
    return peer_figures(result, stage, endpoint, model, served)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeline", default="support_tickets")
    p.add_argument("--count", type=int, default=1280, help="requests")
    p.add_argument("--workers", type=int, default=64, help="requests in flight at once")
    p.add_argument("--ai-url", default=os.environ.get("AI_SERVICE_URL", "http://127.0.0.1:8600"),
                   help="the AI stand-in (its counters are reset first)")
    args = p.parse_args(argv)
    requests.post(f"{args.ai_url}/v1/stats/reset", timeout=10).raise_for_status()
    found = run_router_peer(pipeline_spec.load(args.pipeline), args.ai_url, args.count, args.workers, PEER)
    print(json.dumps({k: v for k, v in found.items() if k != "completion_times"}, indent=2))


if __name__ == "__main__":
    main()
