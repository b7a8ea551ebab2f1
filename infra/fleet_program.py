"""A stage's consumer fleet as a supervisord program: the one place that says how a supervised
fleet is started (its command and environment) and how long a graceful stop may take."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping

from consumers.pipeline_config import PipelineConfig
from infra import supervisor
from infra.layout import REPO

# Beyond the fleet's shutdown deadline: its threads' join margin and closing its clients.
STOP_MARGIN_S = 30


def fleet_program(name: str, run_id: str, stage: str, config: PipelineConfig, env: Mapping[str, str],
                  metrics_port: int | None = None, startsecs: int = 5) -> supervisor.Program:
    """`python -m consumers.fleet` for one stage of `config`, addresses and secrets in `env`
    (never on the command line), stopped with SIGTERM and given its shutdown deadline."""
    command = [sys.executable, "-m", "consumers.fleet", "--stage", stage, "--run-id", run_id,
               "--config", config.to_json(), "--members", str(config.stage(stage).members)]
    if metrics_port is not None:
        command += ["--metrics-port", str(metrics_port)]
    return supervisor.Program(name, command, REPO, {**env, "PYTHONUNBUFFERED": "1"},
                              stopwaitsecs=math.ceil(config.shutdown_deadline_s) + STOP_MARGIN_S,
                              startsecs=startsecs)
