"""A benchmark stopped with SIGTERM runs its cleanup, as `running_pipeline` needs to stop fleets."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from infra.layout import REPO

CHILD = textwrap.dedent("""
    import sys, threading
    from bench.interrupt import unwind_on_sigterm
    unwind_on_sigterm()
    try:
        print("ready", flush=True)
        threading.Event().wait()
    finally:
        open(sys.argv[1], "w").write("cleaned up")
""")


def _run_and_terminate(tmp_path: Path, code: str) -> tuple[int, str | None]:
    marker = tmp_path / "cleanup"
    child = subprocess.Popen([sys.executable, "-c", code, str(marker)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    child.send_signal(signal.SIGTERM)
    status = child.wait(timeout=30)
    return status, marker.read_text() if marker.exists() else None


def test_sigterm_runs_the_finally_blocks_and_exits_143(tmp_path: Path) -> None:
    assert _run_and_terminate(tmp_path, CHILD) == (143, "cleaned up")


def test_without_it_sigterm_skips_them(tmp_path: Path) -> None:
    """The default this replaces: the process ends by the signal and nothing is cleaned up."""
    default = CHILD.replace("unwind_on_sigterm()", "")
    assert _run_and_terminate(tmp_path, default) == (-signal.SIGTERM, None)
