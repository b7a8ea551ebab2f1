"""How a stage's consumer fleet is started (its command) and how long a graceful stop may take:
the one place both deployment backends read, supervisord programs here (`supervisord`) and
Kubernetes pods (`manifests`)."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import consumers
from consumers.config.candidate import PipelineConfig
from host import supervisor

# Beyond the fleet's shutdown deadline: its threads' join margin and closing its clients.
STOP_MARGIN_S = 30
# Where `python -m consumers.runtime.fleet` runs: the folder holding the runtime's package.
RUNTIME_ROOT = Path(consumers.__file__).resolve().parent.parent


def fleet_command(run_id: str, stage: str, config: PipelineConfig, members: int,
                  metrics_port: int | None = None, python: str = sys.executable,
                  version: int | None = None, canary: int | None = None) -> list[str]:
    """`python -m consumers.runtime.fleet` running `members` members of one stage of `config`
    (registry `version`; for `canary`, on what the group lends it); addresses and secrets go in
    its environment, never on the command line."""
    command = [python, "-m", "consumers.runtime.fleet", "--stage", stage, "--run-id", run_id,
               "--config", config.to_json(), "--members", str(members)]
    if metrics_port is not None:
        command += ["--metrics-port", str(metrics_port)]
    if version is not None:
        command += ["--version", str(version)]
    if canary is not None:
        command += ["--canary", str(canary)]
    return command


def stop_wait_s(config: PipelineConfig) -> int:
    """How long SIGTERM may take before SIGKILL: the members' revoke deadline and the margin."""
    return math.ceil(config.shutdown_deadline_s) + STOP_MARGIN_S


def fleet_program(name: str, run_id: str, stage: str, config: PipelineConfig, env: Mapping[str, str],
                  metrics_port: int | None = None, startsecs: int = 5, version: int | None = None,
                  canary: int | None = None) -> supervisor.Program:
    """The fleet of one stage of `config` as a supervisord program, stopped with SIGTERM and
    given its shutdown deadline. It reads its pipeline's spec from the folder this process does
    ($PIPELINES_DIR when set): supervisord passes a program only the environment it is given."""
    command = fleet_command(run_id, stage, config, config.stage(stage).members, metrics_port,
                            version=version, canary=canary)
    specs = {"PIPELINES_DIR": os.environ["PIPELINES_DIR"]} if os.environ.get("PIPELINES_DIR") else {}
    return supervisor.Program(name, command, RUNTIME_ROOT, {**env, **specs, "PYTHONUNBUFFERED": "1"},
                              stopwaitsecs=stop_wait_s(config), startsecs=startsecs)
