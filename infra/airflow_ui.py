"""Run Airflow (UI and API server, scheduler, DAG processor, triggerer) for a stack, in the background.

    python -m infra.airflow_ui up      # returns once the UI answers and every component is healthy
    python -m infra.airflow_ui down

STACK=test selects the test stack. `airflow standalone` is one supervised process tree, started in
its own session with its output in `.local/<stack>/airflow-ui.log`, so stopping it is one process
group signal. Standalone keeps the executor configured in airflow.cfg when it runs tasks locally
(LocalExecutor by default, on the stack's PostgreSQL). Tests use `running()`, which stops it
whatever happens. `make airflow` is the foreground variant for people.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from host.processes import alive, spawn, tail, terminate
from infra.layout import REPO, Layout, current, port_in_use, wait_for_port

COMPONENTS = ("metadatabase", "scheduler", "dag_processor", "triggerer")


def log_file(layout: Layout) -> Path:
    return layout.root / "airflow-ui.log"


def pid_file(layout: Layout) -> Path:
    return layout.root / "airflow-ui.pid"


def base_url(layout: Layout) -> str:
    return f"http://127.0.0.1:{layout.airflow_port}"


def stack_env(layout: Layout) -> dict[str, str]:
    """The stack's shell assignments (written by `python -m infra.stack up`)."""
    if not layout.env_file.exists():
        raise SystemExit(f"no {layout.name} stack: run `STACK={layout.name} python -m infra.stack up` first")
    env = {}
    for line in layout.env_file.read_text().splitlines():
        key, _, value = line.partition("=")
        env[key] = shlex.split(value)[0] if value else ""
    return env


def _pid(layout: Layout) -> int | None:
    path = pid_file(layout)
    return int(path.read_text()) if path.exists() else None


def health(layout: Layout) -> dict[str, str]:
    """Status of each component from the API server's health endpoint (empty while it is down)."""
    try:
        with urllib.request.urlopen(f"{base_url(layout)}/api/v2/monitor/health", timeout=5) as resp:
            body = json.load(resp)
    except (OSError, ValueError):
        return {}
    return {name: (body.get(name) or {}).get("status", "unknown") for name in COMPONENTS}


def wait_ready(layout: Layout, pid: int, timeout_s: float) -> None:
    """Block until the UI answers and every component reports healthy; fail early if Airflow exits."""
    deadline = time.monotonic() + timeout_s
    status: dict[str, str] = {}
    while time.monotonic() < deadline:
        if not alive(pid):
            raise RuntimeError(f"airflow standalone exited during start:\n{tail(log_file(layout))}")
        status = health(layout)
        if status and all(value == "healthy" for value in status.values()):
            return
        time.sleep(1)
    raise TimeoutError(f"Airflow not ready after {timeout_s:.0f}s (health: {status or 'no answer'}):\n"
                       f"{tail(log_file(layout))}")


def start(layout: Layout, extra_env: dict[str, str] | None = None, timeout_s: float = 240) -> int:
    """Start standalone for the stack unless ours already runs; return its pid once it is ready."""
    pid = _pid(layout)
    if alive(pid):
        wait_ready(layout, pid, timeout_s)
        return pid
    if port_in_use(layout.airflow_port):
        raise SystemExit(f"port {layout.airflow_port} is taken by something else: stop it first")
    # Loopback only, like the rest of the stack, unless the caller says otherwise.
    env = {**os.environ, "AIRFLOW__API__HOST": "127.0.0.1", **stack_env(layout), **(extra_env or {})}
    airflow = str(Path(sys.executable).parent / "airflow")
    with open(log_file(layout), "ab") as log:
        log.write(f"\n=== airflow standalone starting at {time.strftime('%F %T')} ===\n".encode())
    pid = spawn([airflow, "standalone"], log_file(layout), env=env, cwd=REPO)
    pid_file(layout).write_text(str(pid))
    try:
        if not wait_for_port(layout.airflow_port, timeout_s):
            raise TimeoutError(f"the UI did not open port {layout.airflow_port}:\n{tail(log_file(layout))}")
        wait_ready(layout, pid, timeout_s)
    except BaseException:
        stop(layout)
        raise
    return pid


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid`: task runners move into process groups of their own, so
    signalling the standalone group alone would miss them."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(") ", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop(layout: Layout, grace_s: float = 30) -> None:
    """SIGTERM the standalone process group (SIGKILL after the grace period), then anything left
    of its tree, and wait for the UI port to close."""
    pid = _pid(layout)
    if alive(pid):
        leftovers = _descendants(pid)
        terminate(pid, grace_s=grace_s)
        for child in leftovers:
            if alive(child):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while any(alive(c) for c in leftovers) and time.monotonic() < deadline:
            time.sleep(0.2)
        for child in leftovers:
            if alive(child):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
    pid_file(layout).unlink(missing_ok=True)
    deadline = time.monotonic() + 15
    while port_in_use(layout.airflow_port) and time.monotonic() < deadline:
        time.sleep(0.2)


@contextlib.contextmanager
def running(layout: Layout, extra_env: dict[str, str] | None = None,
            timeout_s: float = 240) -> Iterator[str]:
    """Airflow for the stack for the duration of the block; yields the UI's base URL.

    Refuses to share an instance started elsewhere (`up`), which would neither have the block's
    settings nor be the block's to stop.
    """
    if alive(_pid(layout)):
        raise RuntimeError(f"Airflow already runs for the {layout.name} stack: "
                           f"`STACK={layout.name} python -m infra.airflow_ui down` first")
    start(layout, extra_env, timeout_s)
    try:
        yield base_url(layout)
    finally:
        stop(layout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("up", "down"))
    args = parser.parse_args()
    layout = current()
    if args.command == "up":
        pid = start(layout)
        print(f"Airflow for the {layout.name} stack on {base_url(layout)} (pid {pid}, "
              f"log {log_file(layout)}); user admin, password in "
              f"{stack_env(layout)['AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE']}")
    else:
        stop(layout)
        print(f"Airflow for the {layout.name} stack stopped")


if __name__ == "__main__":
    main()
