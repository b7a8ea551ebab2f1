"""A benchmark stopped with SIGTERM unwinds as on Ctrl-C.

Python's default for SIGTERM ends the process at once: no `finally` runs, so the fleets a run
started in child processes kept serving and its `runs` row never got its end. Raising
`SystemExit` instead lets `running_pipeline` stop the fleets and the stacks' context managers
stop what they started.
"""

from __future__ import annotations

import signal
from types import FrameType

TERMINATED = 128 + signal.SIGTERM  # the exit status a shell reports for a process SIGTERM ended


def _exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(TERMINATED)


def unwind_on_sigterm() -> None:
    """From now on, SIGTERM raises `SystemExit(143)` in the main thread."""
    signal.signal(signal.SIGTERM, _exit)
