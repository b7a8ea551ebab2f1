"""The shared-quota lab: three tenants of the reference pipeline, weights 2 : 1 : 1, spending one
account of a stand-in started for them, and the account's counters read as the run goes
(`bench/shared_quota.py` runs its phases on it)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import requests
import yaml
from rich.progress import Progress

from bench.stacks import Stack
from consumers.config import pipeline_spec, presets
from consumers.config.candidate import Endpoints
from consumers.runs.pipeline_run import Pipeline, new_run_id, running_pipeline
from consumers.runtime.storage import free_connections

WEIGHTS = {"tenant_a": 2.0, "tenant_b": 1.0, "tenant_c": 1.0}
QUOTA = "lab"  # each run's quota is named lab_<id>: claims a killed run left behind are not its
BASE = "generate"  # the endpoint of the reference pipeline that spends the quota
# What the quota allows in each run: the one dimension that binds. Concurrency 48 is under the
# 3 x 40 calls the three fleets could have out; 600 requests a minute under the ~1,000 that
# 48 calls of 3 s make; 24,000 tokens a minute under what those take.
LIMITS = {"concurrency": {"concurrency": 48}, "requests": {"requests_per_minute": 600},
          "tokens": {"tokens_per_minute": 24_000}}
TOKENS_PER_CALL = 40  # fewer than a generate call takes (its prompt and answer): the load sent is more
POOL = 40  # each stage's calls or records at once: more than any tenant's share of the quota
SAMPLE_S = 0.5  # how often the account's counters are read


def write_pipelines(folder: Path, binds: str, lanes: dict[str, str] | None = None,
                    quota_name: str = QUOTA) -> Path:
    """A pipelines folder: the shipped specs, three tenants of the reference pipeline with
    generate on the quota, and the quota giving them their weights (and `lanes`, lane
    standard for the others)."""
    (folder / "quotas").mkdir(parents=True, exist_ok=True)
    for shipped in pipeline_spec.PIPELINES_DIR.glob("*.yaml"):
        (folder / shipped.name).write_text(shipped.read_text())
    reference = yaml.safe_load(pipeline_spec.path_of(pipeline_spec.REFERENCE).read_text())
    for name in WEIGHTS:
        reference["name"] = name
        reference["endpoints"][BASE]["quota"] = quota_name
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(reference, sort_keys=False))
    quota = {"name": quota_name, "description": "one account the three tenants spend", **LIMITS[binds],
             "pipelines": {name: {"weight": weight, "lane": (lanes or {}).get(name, "standard")}
                           for name, weight in WEIGHTS.items()}}
    (folder / "quotas" / f"{quota_name}.yaml").write_text(yaml.safe_dump(quota, sort_keys=False))
    return folder


def account(stand_in: str) -> dict[str, Any]:
    """The counters of the stand-in's one account."""
    (counters,) = requests.get(f"{stand_in}/v1/stats", timeout=5).json()["accounts"].values()
    return counters


def start_stand_in(port: int, time_scale: float) -> subprocess.Popen:
    """The tenants' stand-in on `port`, refused if something answers there already (another
    run's stand-in would count this run's calls)."""
    try:
        requests.get(f"http://127.0.0.1:{port}/v1/stats", timeout=1)
    except requests.RequestException:
        pass
    else:
        raise SystemExit(f"port {port} is taken by another service: pass --port")
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


@contextmanager
def tenants(stack: Stack, binds: str, time_scale: float, port: int, lanes: dict[str, str] | None = None,
            names: tuple[str, ...] = tuple(WEIGHTS)) -> Iterator[tuple[str, dict[str, Pipeline]]]:
    """The stand-in and the pipelines' fleets (`names`), running; the stand-in's URL and the
    pipelines."""
    free_before = free_connections(stack.database_url)
    with tempfile.TemporaryDirectory() as folder, ExitStack() as running:
        quota_name = f"{QUOTA}_{uuid.uuid4().hex[:8]}"
        os.environ["PIPELINES_DIR"] = str(write_pipelines(Path(folder), binds, lanes, quota_name))
        running.callback(wait_released, stack.database_url, free_before)
        try:
            stand_in = start_stand_in(port, time_scale)
            running.callback(stop_process, stand_in)
            url = f"http://127.0.0.1:{port}"
            pipelines = {}
            for name in names:
                params = presets.PresetParams(partitions=8, concurrency=POOL, time_scale=time_scale,
                                              flow_members=2, pipeline=name)
                endpoints = Endpoints.on(url, pipeline_spec.load(name))
                pipelines[name] = running.enter_context(running_pipeline(
                    presets.build("flow", params), stack.kafka, stack.database_url, endpoints,
                    run_id=new_run_id(name.replace("_", "-")), scenario="shared-quota", fleet_processes=True))
            yield url, pipelines
        finally:
            os.environ.pop("PIPELINES_DIR", None)


def stop_process(process: subprocess.Popen) -> None:
    """Stop the stand-in and wait for it: the next run binds its port."""
    process.terminate()
    process.wait(30)


def wait_released(database_url: str, free_before: int, timeout_s: float = 60.0) -> None:
    """Until the fleets' database connections are closed: the next run's fleets size their
    pools to what the server has free, and three pipelines' fleets take most of it."""
    deadline = time.monotonic() + timeout_s
    while free_connections(database_url) < free_before - 2 and time.monotonic() < deadline:
        time.sleep(0.5)


class Sampler:
    """The account's counters read every SAMPLE_S, with the run's progress shown."""

    def __init__(self, url: str, bar: Progress, total_s: float, title: str) -> None:
        self.url, self.bar = url, bar
        self.task = bar.add_task(title, total=total_s)
        self.started = time.monotonic()
        self.series: list[tuple[float, dict[str, Any]]] = []

    def read(self) -> None:
        elapsed = time.monotonic() - self.started
        self.series.append((elapsed, account(self.url)))
        self.bar.update(self.task, completed=elapsed)

    def until(self, done: Callable[[], bool]) -> None:
        """Read every SAMPLE_S until `done`, and once more then."""
        while not done():
            self.read()
            time.sleep(SAMPLE_S)
        self.read()

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def busy(series: list[tuple[float, dict[str, Any]]]) -> list[tuple[float, dict[str, float]]]:
    """Each caller's busy seconds at each reading."""
    return [(at, {n: r["callers"].get(n, {}).get("busy_s", 0.0) for n in WEIGHTS}) for at, r in series]


def in_flight(series: list[tuple[float, dict[str, float]]]) -> list[tuple[float, dict[str, float]]]:
    """Each caller's mean calls in flight between two readings, at the second."""
    return [(b[0], {n: (b[1][n] - a[1][n]) / (b[0] - a[0]) for n in WEIGHTS})
            for a, b in itertools.pairwise(series)]
