"""LiteLLM's proxy as the stack's AI gateway (`GATEWAY=litellm`), in front of the AI stand-in.

Teams reach models through a gateway that holds the keys, meters requests and tokens per minute
for each model and prices every call; this puts the common open one in the loop. It routes each
model of `MODELS` to the stand-in's OpenAI-compatible chat completions (`<stand-in>/v1/chat/
completions`, served for a spec endpoint whose `stand_in` says `protocol: openai_chat`), and the
models' `rpm`/`tpm` limits are set here only.

LiteLLM pins what Airflow pins differently, so it runs from an environment of its own
(`.local/litellm-venv`, `make gateway-venv`, from `infra/litellm/requirements.lock`). Nothing is
fetched at run time: its model cost map and its other lists are the copies it ships
(`LITELLM_LOCAL_*`), its telemetry is off, and each model's prices are in the config, so
`x-litellm-response-cost` is computed locally. It runs
without a database (master key only): its environment is built from nothing rather than
inherited, so the stack's `DATABASE_URL` is never taken for the proxy's own. The master key
reaches it through that environment only; the config names it (`os.environ/...`) and holds no
secret.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from host.processes import alive, spawn, tail, terminate
from infra.layout import LOCAL, Layout, chosen, port_in_use

NONE, LITELLM = "none", "litellm"
MODES = (NONE, LITELLM)
VENV = LOCAL / "litellm-venv"
PID_FILE = "gateway.pid"  # beside its config: what `stop_every` stops
KEY_ENV = "LITELLM_MASTER_KEY"
# The stand-in's bearer token, when it requires one (the OpenAI client behind LiteLLM wants a key
# even for a service that checks none).
UPSTREAM_KEY_ENV = "AI_SERVICE_TOKEN"
LOCAL_COPIES = tuple(f"LITELLM_LOCAL_{name}" for name in (
    "MODEL_COST_MAP", "ANTHROPIC_BETA_HEADERS", "BLOG_POSTS", "POLICY_TEMPLATES", "AUTOROUTER_PRESETS"))


@dataclass(frozen=True)
class Model:
    """A model the gateway serves: its per-minute limits and its prices in dollars per token."""

    name: str
    rpm: int
    tpm: int
    input_cost_per_token: float
    output_cost_per_token: float


# A small model that classifies and routes, a large one that writes, and the large one's next
# version that a canary switches to; prices of the kind providers publish ($0.15 and $0.60, $2.50
# and $10 per million input and output tokens; the next version half as dear again), as the
# specs declare them.
MODELS = (
    Model("small-model", rpm=600, tpm=200_000, input_cost_per_token=1.5e-7, output_cost_per_token=6e-7),
    Model("large-model", rpm=120, tpm=60_000, input_cost_per_token=2.5e-6, output_cost_per_token=1e-5),
    Model("large-model-next", rpm=120, tpm=60_000, input_cost_per_token=3.75e-6,
          output_cost_per_token=1.5e-5),
)


def mode() -> str:
    """Which gateway `up` runs: GATEWAY, `none` (default) or `litellm`."""
    return chosen("GATEWAY", MODES)


def new_key(token: str) -> str:
    """A master key from a random token: LiteLLM refuses one that does not start with `sk-`."""
    return f"sk-{token}"


def config(upstream: str, models: Sequence[Model] = MODELS) -> dict:
    """The proxy's configuration: every model to the stand-in at `upstream` as an OpenAI
    provider, with its limits and prices; no retries on the caller's behalf (a retried call is
    one the caller did not make), the master key read from the environment."""
    return {
        "model_list": [{
            "model_name": model.name,
            "litellm_params": {
                "model": f"openai/{model.name}",
                "api_base": f"{upstream}/v1",
                "api_key": f"os.environ/{UPSTREAM_KEY_ENV}",
                # LiteLLM passes `user` on only for OpenAI's own models; the stand-in tells the
                # requests apart by it (and counts duplicates on it), as a provider's abuse checks do.
                "allowed_openai_params": ["user"],
                "rpm": model.rpm,
                "tpm": model.tpm,
                "input_cost_per_token": model.input_cost_per_token,
                "output_cost_per_token": model.output_cost_per_token,
            },
        } for model in models],
        "litellm_settings": {"num_retries": 0},
        # LiteLLM routes by the deployments' rpm/tpm but lets calls past them through unless
        # this check enforces them (429 "No deployments available for selected model").
        "router_settings": {"num_retries": 0, "optional_pre_call_checks": ["enforce_model_rate_limits"]},
        "general_settings": {"master_key": f"os.environ/{KEY_ENV}"},
    }


def write_config(directory: Path, upstream: str, models: Sequence[Model] = MODELS) -> Path:
    """`directory/config.yaml`, the file the proxy reads (it holds no secret)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config(upstream, models), sort_keys=False))
    return path


def environment(key: str, upstream_key: str | None) -> dict[str, str]:
    """The proxy's whole environment: the master key and LiteLLM's own (`litellm_environment`)."""
    return {**litellm_environment(upstream_key), KEY_ENV: key}


def litellm_environment(upstream_key: str | None) -> dict[str, str]:
    """The whole environment of a LiteLLM process, the proxy or a Router of the benchmark's: the
    stand-in's token (or a placeholder for a stand-in that checks none), and the settings that
    keep it off the network."""
    return {
        "PATH": f"{VENV / 'bin'}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        UPSTREAM_KEY_ENV: upstream_key or "no-token",
        "LITELLM_MODE": "PRODUCTION",  # no .env file read from the working folder
        "LITELLM_LOG": "WARNING",  # at INFO it writes six lines for every call
        "LITELLM_TELEMETRY_DISABLED": "True",
        # Each of these is otherwise fetched from the internet (the cost map at start, the others
        # when an endpoint or a provider needs them); the copies LiteLLM ships are used instead.
        **dict.fromkeys(LOCAL_COPIES, "True"),
    }


def command(config_file: Path, port: int) -> list[str]:
    """The proxy on loopback, one worker. No secret: ps shows this line."""
    return [str(VENV / "bin" / "litellm"), "--config", str(config_file), "--host", "127.0.0.1",
            "--port", str(port), "--num_workers", "1"]


def start(directory: Path, port: int, upstream: str, key: str, models: Sequence[Model] = MODELS,
          timeout_s: float = 180.0) -> int:
    """Write the config to `directory`, start the proxy and wait until it listens (its port opens
    once its start-up is done); return its pid. Its output goes to `directory/gateway.log`."""
    litellm = VENV / "bin" / "litellm"
    if not litellm.exists():
        raise RuntimeError(f"LiteLLM's proxy is not installed at {VENV}: run `make gateway-venv`")
    if port_in_use(port):
        raise RuntimeError(f"cannot start LiteLLM's proxy: 127.0.0.1:{port} is already in use")
    log = log_file(directory)
    pid = spawn(command(write_config(directory, upstream, models), port), log,
                env=environment(key, os.environ.get(UPSTREAM_KEY_ENV)), cwd=directory)
    (directory / PID_FILE).write_text(str(pid))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            raise RuntimeError(f"LiteLLM's proxy exited during start-up:\n{tail(log)}")
        if port_in_use(port):
            return pid
        time.sleep(0.5)
    terminate(pid, grace_s=10)
    raise RuntimeError(f"LiteLLM's proxy did not listen on {port} within {timeout_s:.0f}s:\n{tail(log)}")


def stop_every(layout: Layout) -> None:
    """Every proxy started in a directory under the stack's gateway folder and still running
    stopped: the stack's own, and one a test started there and an interrupted run left (its
    pid file names it; a pid since reused by another program is left alone)."""
    for path in folder(layout).glob(f"**/{PID_FILE}"):
        pid = int(path.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline")
        if alive(pid) and cmdline.exists() and b"litellm" in cmdline.read_bytes():
            terminate(pid, grace_s=10)
        path.unlink(missing_ok=True)


def folder(layout: Layout) -> Path:
    """Where a stack's gateway keeps its config and its log."""
    return layout.root / "gateway"


def log_file(directory: Path) -> Path:
    return directory / "gateway.log"
