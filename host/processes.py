"""Start and stop long-running processes: the stack's services and supervisord.

Each runs in its own session (so `make` finishing does not take it down) with its output in a
log file; stopping sends SIGTERM to the whole process group, waits, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
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
    """True while any thread of the process lives. A process whose main thread has exited shows
    as a zombie in /proc/<pid>/stat while its other threads still run and hold its sockets (a
    JVM tearing down), so every thread is looked at; a process of zombies only counts as dead."""
    if not pid:
        return False
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    return any(_state(f"/proc/{pid}/task/{tid}/stat") not in (None, "Z", "X") for tid in threads)


def _state(stat_path: str) -> str | None:
    """The state letter of a /proc stat file, None once the thread is gone."""
    try:
        with open(stat_path) as stat:
            return stat.read().rsplit(") ", 1)[1][0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def terminate(*pids: int | None, grace_s: float = 30.0) -> None:
    """SIGTERM the process groups of `pids` together, then SIGKILL those that outlive `grace_s`.

    Together, because the processes may need each other to stop cleanly: a Kafka node's
    controlled shutdown asks the controller quorum, and the last of three nodes stopped one by
    one found no quorum left and waited out its whole grace period before being killed.
    """
    running = [pid for pid in pids if pid is not None and alive(pid)]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + wait_s
        while running and time.monotonic() < deadline:
            for pid in [pid for pid in running if not alive(pid)]:
                _reap(pid)
                running.remove(pid)
            if running:
                time.sleep(0.1)
        if not running:
            return


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def tail(path: Path, lines: int = 30) -> str:
    """Last lines of a log file, for error messages."""
    if not path.exists():
        return f"(no log at {path})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def environment(variables: Mapping[str, str]) -> Iterator[None]:
    """`variables` set in this process's environment while the block runs, as they were after."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
