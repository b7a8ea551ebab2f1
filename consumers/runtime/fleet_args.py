"""Run N members of one stage's consumer group as threads of one process.

    python -m consumers.runtime.fleet --stage generate --run-id r1 --config @candidate.json
    python -m consumers.runtime.fleet --stage generate --run-id r1 --mode flow --members 4 --window 16

SIGTERM or SIGINT stops the fleet gracefully: members stop taking work, finish their in-flight
records within the deadline, commit and leave the group. (The command line stands apart from the
fleet so that a pod's manifest is checked against the parser the pod runs.)
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from consumers.config import kafka_connection, profiles
from consumers.config.candidate import ENDPOINTS_ENV, PipelineConfig


def config_from_args(args: argparse.Namespace) -> PipelineConfig:
    """The --config document with the command-line overrides applied to it."""
    config = PipelineConfig.from_argument(args.config)
    stage = config.stage(args.stage)
    stage = replace(stage, **{k: v for k, v in (("mode", args.mode), ("members", args.members),
                                                ("window", args.window), ("batch_size", args.batch_size))
                              if v is not None})
    overrides = {k: v for k, v in (("profile", args.profile), ("group_protocol", args.group_protocol),
                                   ("time_scale", args.time_scale), ("key_strategy", args.keys),
                                   ("stats_interval_ms", args.stats_interval_ms))
                 if v is not None}
    return replace(config, **overrides).with_stages(**{args.stage: stage})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", required=True, help="a stage of the configuration's pipeline")
    p.add_argument("--run-id", required=True, help="run the records are written under")
    p.add_argument("--prefix", help="topic prefix of the pipeline (default: the run id)")
    p.add_argument("--config", default="{}",
                   help="pipeline configuration as JSON, or @file.json (defaults for missing keys)")
    p.add_argument("--mode", choices=profiles.CONSUMER_MODES)
    p.add_argument("--members", type=int, help="group members in this process")
    p.add_argument("--window", type=int, help="flow and share modes: records in flight per member")
    p.add_argument("--batch-size", type=int, help="bounded mode: records per consume")
    p.add_argument("--profile", choices=list(profiles.PROFILES))
    p.add_argument("--group-protocol", choices=profiles.GROUP_PROTOCOLS)
    p.add_argument("--time-scale", type=float,
                   help="shrinks max.poll.interval.ms and the session timeout with the AI latency")
    p.add_argument("--keys", help="downstream event keys: uuid | none | field:<name>")
    p.add_argument("--stats-interval-ms", type=int)
    kafka_connection.add_argument(p)
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    p.add_argument("--ai-endpoints", default=os.environ.get(ENDPOINTS_ENV, "{}"),
                   help="JSON object: the URL of each AI endpoint the pipeline spec names")
    p.add_argument("--ai-token-env", default="AI_SERVICE_TOKEN",
                   help="environment variable holding the bearer token (unset: no auth header)")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: off)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address /metrics listens on (0.0.0.0 in a pod, for its readiness probe)")
    p.add_argument("--instance",
                   help="names this process's members <stage>-<instance>-<n>, apart from other "
                        "processes of the stage (one pod per member on Kubernetes)")
    p.add_argument("--version", type=int, help="the registry's configuration version this fleet runs")
    p.add_argument("--canary", type=int,
                   help="work on the partitions the stage's group lends canary N (its members: "
                        "<stage>-canaryN-<n> unless --instance says otherwise)")
    return p
