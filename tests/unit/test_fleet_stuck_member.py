"""A fleet whose member is stuck in a client call past the shutdown deadline exits anyway, so
its supervisor can start it again: the member's thread would otherwise keep the process up
doing nothing (a frozen broker held one in a transactional call, and its partitions sat
unconsumed until the run ended)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STUCK = textwrap.dedent("""
    import threading
    from consumers.runtime import fleet

    threading.Thread(target=threading.Event().wait, name="generate-1").start()  # never returns

    class Stuck:
        def stop(self):
            raise fleet.MembersStuck("members still running after the shutdown deadline: ['generate-1']")

    fleet.stop_or_exit(Stuck(), "generate")
""")


def test_a_fleet_with_a_member_stuck_past_the_deadline_exits_for_its_supervisor() -> None:
    done = subprocess.run([sys.executable, "-c", STUCK], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == os.EX_SOFTWARE
    assert "generate-1" in done.stderr and "exiting" in done.stderr
