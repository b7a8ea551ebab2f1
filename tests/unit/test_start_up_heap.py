"""A fleet process's start-up heap leaves the collector's generations (in a child process, so
the test run's own heap stays as it is)."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json
import consumers.runtime.fleet  # everything a fleet process imports
from consumers.runtime import start_up_heap
tracked = len(gc.get_objects())
start_up_heap.freeze()
print(json.dumps({"tracked": tracked, "frozen": gc.get_freeze_count(), "left": len(gc.get_objects())}))
"""


def test_after_the_freeze_a_full_collection_has_nothing_of_start_up_to_walk() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    counts = json.loads(done.stdout)
    assert counts["tracked"] > 10_000  # the imports alone: what a full collection walked
    assert counts["frozen"] > 0.9 * counts["tracked"]  # start-up's garbage was collected first
    assert counts["left"] < 100
