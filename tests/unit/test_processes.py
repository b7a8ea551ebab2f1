"""Stopping the stack's processes: `alive` while any thread runs, `terminate` of several at once."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

from host.processes import alive, spawn, terminate
from tests.unit.test_member_delivery import wait_for


def python(tmp_path: Path, name: str, code: str, *args: str) -> int:
    """A detached Python child running `code` with `args`, in tmp_path; output to <name>.log."""
    return spawn([sys.executable, "-c", textwrap.dedent(code), *args], tmp_path / f"{name}.log", cwd=tmp_path)


def leader_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]


def test_a_process_whose_main_thread_exited_is_alive_while_another_thread_runs(tmp_path: Path) -> None:
    pid = python(tmp_path, "threads", """
        import ctypes, threading, time
        threading.Thread(target=time.sleep, args=(30,)).start()
        ctypes.CDLL(None).pthread_exit(None)
    """)
    try:
        wait_for(lambda: leader_state(pid) == "Z")  # the main thread is gone, the process is not
        assert alive(pid)
    finally:
        terminate(pid, grace_s=5)
    assert not alive(pid)


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    pid = python(tmp_path, "stubborn", """
        import pathlib, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pathlib.Path("ready").touch()
        time.sleep(60)
    """)
    wait_for((tmp_path / "ready").exists)
    started = time.monotonic()
    terminate(pid, grace_s=0.5)
    assert not alive(pid)
    assert time.monotonic() - started >= 0.5  # it had its grace period first


def test_processes_are_told_to_stop_together(tmp_path: Path) -> None:
    # Each stops cleanly only once the other has been told to stop, as the nodes of a Kafka
    # quorum do: told one after the other, the first would wait out its grace and be killed.
    peer = """
        import pathlib, signal, sys, time
        me, other = sys.argv[1], sys.argv[2]
        def stop(*_):
            pathlib.Path(me + ".stopping").touch()
            deadline = time.monotonic() + 5
            while not pathlib.Path(other + ".stopping").exists():
                if time.monotonic() > deadline:
                    sys.exit(3)
                time.sleep(0.02)
            pathlib.Path(me + ".clean").touch()
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        pathlib.Path(me + ".ready").touch()
        time.sleep(60)
    """
    pids = [python(tmp_path, me, peer, me, other) for me, other in (("a", "b"), ("b", "a"))]
    wait_for(lambda: all((tmp_path / f"{n}.ready").exists() for n in "ab"))
    terminate(*pids, grace_s=2)
    assert not any(alive(pid) for pid in pids)
    assert (tmp_path / "a.clean").exists() and (tmp_path / "b.clean").exists()
