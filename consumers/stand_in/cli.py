"""The stand-in as a process: `python -m consumers.stand_in --pipelines all --port 8600`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import Any

import consumers.stand_in
from consumers.config.pipeline_spec import SpecError, available, load
from consumers.stand_in.config import ConfigError, ServiceConfig
from consumers.stand_in.server import serve

log = logging.getLogger(__name__)

DEFAULT_TOKEN_ENV = "AI_SERVICE_TOKEN"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m consumers.stand_in",
                                description=(consumers.stand_in.__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--pipelines", default="all",
                   help="specs whose endpoints are served: all, or a comma list of names or paths")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    p.add_argument("--port", type=int, default=8600, help="port to bind (0 picks a free one)")
    p.add_argument("--time-scale", type=float, default=1.0, help="factor applied to every duration")
    p.add_argument("--limit", type=int, help="concurrency limit of every endpoint, instead of each spec's")
    p.add_argument("--error-rate", type=float, default=0.0, help="fraction answered 500 (every endpoint)")
    p.add_argument("--hang-rate", type=float, default=0.0, help="fraction answered only after --hang-s")
    p.add_argument("--hang-s", type=float, default=30.0, help="how long a hang lasts, real-scale seconds")
    p.add_argument("--token-env", default=DEFAULT_TOKEN_ENV,
                   help="environment variable holding the bearer token; unset or empty disables auth")
    p.add_argument("--seed", type=int, help="seed for latencies and injected faults (reproducible runs)")
    p.add_argument("--log-level", default="INFO", help="DEBUG logs every request")
    return p


def config_from_args(args: argparse.Namespace) -> ServiceConfig:
    """The service configuration the command line asks for (raises SpecError or ConfigError)."""
    names = available() if args.pipelines == "all" else [n.strip() for n in args.pipelines.split(",")]
    overrides: dict[str, Any] = {"error_rate": args.error_rate, "hang_rate": args.hang_rate,
                                 "hang_s": args.hang_s}
    if args.limit is not None:
        overrides["limit"] = args.limit
    return ServiceConfig.from_specs([load(name) for name in names if name], time_scale=args.time_scale,
                                    token=os.environ.get(args.token_env) or None, seed=args.seed,
                                    **overrides)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT, then stop accepting and exit 0."""
    arguments = parser()
    args = arguments.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = config_from_args(args)
    except (ConfigError, SpecError) as exc:
        arguments.error(str(exc))
    server = serve(config, args.host, args.port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    host, port = server.server_address[:2]
    log.info("serving on %s port %s (time scale %s, auth %s, endpoints %s)", host, port, config.time_scale,
             "on" if config.token else "off",
             ", ".join(f"{name} {e.path}" for name, e in config.endpoints.items()))
    while not stop.wait(0.5):
        pass
    log.info("stopping")
    server.shutdown()
    server.server_close()
    return 0
