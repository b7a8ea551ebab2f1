"""How much the machine itself delayed work during a benchmark phase.

The steady phase's overhead p99 is a handful of requests out of hundreds, and on a small or
shared machine those are the ones whose thread waited for a CPU. To tell the platform's cost
from the machine's, a phase is measured with:

- a probe process that only sleeps PROBE_INTERVAL_S at a time and records how late each
  wake-up came: a process with no work of its own is late only when every CPU was taken
  (by the phase's own processes, or by the host when the machine is virtual);
- the CPUs' busy and steal shares over the phase, from /proc/stat (steal: time the hypervisor
  gave the virtual CPUs to someone else). Both are None where /proc/stat does not exist.

Run as `python -m bench.machine_noise`: it probes until its stdin closes, then prints the
lateness of every wake-up (ms, JSON) on stdout.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROBE_INTERVAL_S = 0.005
LATE_MS = 10.0  # a wake-up this much behind its time counts as late
PROC_STAT = Path("/proc/stat")


def cpu_times(text: str) -> tuple[int, int, int]:
    """(total, busy, steal) jiffies from /proc/stat's aggregate `cpu` line; busy is the guest's
    own work (user, nice, system, irq, softirq), steal the time its CPUs were taken away."""
    fields = [int(v) for v in text.splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq
    return busy + idle + iowait + steal, busy, steal


def cpu_shares(before: tuple[int, int, int], after: tuple[int, int, int]) -> dict[str, float | None]:
    """Busy and steal as percentages of the CPU time that passed between two readings."""
    total = after[0] - before[0]
    if total <= 0:
        return {"cpu_busy_pct": None, "cpu_steal_pct": None}
    return {"cpu_busy_pct": round(100 * (after[1] - before[1]) / total, 1),
            "cpu_steal_pct": round(100 * (after[2] - before[2]) / total, 1)}


def lateness_figures(late_ms: list[float], threshold_ms: float = LATE_MS) -> dict[str, Any]:
    """The probe's wake-ups, those at least `threshold_ms` late, and the latest, in ms."""
    late = [ms for ms in late_ms if ms >= threshold_ms]
    return {"probe_wakeups": len(late_ms), "late_wakeups": len(late),
            "late_wakeup_ms_total": round(sum(late), 1),
            "latest_wakeup_ms": round(max(late_ms), 1) if late_ms else None}


@dataclass
class Noise:
    """What `measured` fills in when its block ends."""

    figures: dict[str, Any] = field(default_factory=dict)


def _read_cpu() -> tuple[int, int, int] | None:
    try:
        return cpu_times(PROC_STAT.read_text())
    except OSError:
        return None


@contextmanager
def measured() -> Iterator[Noise]:
    """Probe the machine while the block runs; the figures are in the yielded Noise after it."""
    noise = Noise()
    probe = subprocess.Popen([sys.executable, "-m", "bench.machine_noise"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    before = _read_cpu()
    try:
        yield noise
    except BaseException:
        probe.kill()  # the phase failed: its error, not the probe's figures, is what matters
        probe.wait()
        raise
    after = _read_cpu()
    out, _ = probe.communicate(input="", timeout=30)  # closing stdin ends the probe
    noise.figures = {**lateness_figures(json.loads(out)),
                     **(cpu_shares(before, after) if before and after
                        else {"cpu_busy_pct": None, "cpu_steal_pct": None})}


def probe(interval_s: float = PROBE_INTERVAL_S) -> list[float]:
    """Sleep `interval_s` at a time until stdin closes; how late (ms) each wake-up came."""
    late: list[float] = []
    while True:
        start = time.monotonic()
        if select.select([sys.stdin], [], [], interval_s)[0]:
            return late  # stdin is readable only once it is closed: the phase is over
        late.append(max(0.0, (time.monotonic() - start - interval_s) * 1000))


if __name__ == "__main__":
    print(json.dumps([round(ms, 2) for ms in probe()]))
