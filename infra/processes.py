"""Start and stop the stack's long-running processes.

Each service runs in its own session (so `make` finishing does not take it down) with its
output in a log file; stopping sends SIGTERM to the whole process group, waits, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


def spawn(cmd: list[str], log_file: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> int:
    """Start `cmd` detached, appending its output to `log_file`; return its pid."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=cwd, start_new_session=True,
        )
    return proc.pid


def alive(pid: int | None) -> bool:
    """True when the pid names a live process (zombies count as dead)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def terminate(pid: int | None, grace_s: float = 30.0) -> None:
    """SIGTERM the process group of `pid`, then SIGKILL it if it outlives `grace_s`."""
    if not alive(pid):
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not alive(pid):
                _reap(pid)
                return
            time.sleep(0.1)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def tail(path: Path, lines: int = 30) -> str:
    """Last lines of a log file, for error messages."""
    if not path.exists():
        return f"(no log at {path})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
