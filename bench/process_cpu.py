"""The CPU time each kind of process spent during a benchmark phase, from /proc.

On a 2-core machine that also runs the brokers, PostgreSQL and the stand-in, a scenario that
needs more of the brokers (three of them for `durable`, transactions for exactly once) takes CPU
from the fleets. Which process spent the CPU tells the brokers' cost from the platform's own.
Every process alive at both ends of the phase is counted, by its role (`role_of`, from its
command line); the fleets and the load source are the spawned children of the benchmark's
process, so they are counted together as the pipeline's processes.

A process that started and ended inside the phase is not seen; the fleets start before their
burst and stop after it."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
# (role, a part of the command line that names it), the first that matches
ROLES = (("brokers", "kafka.Kafka"), ("spark", "org.apache.spark"), ("stand-in", "consumers.stand_in"),
         ("pipeline", "multiprocessing.spawn"), ("probe", "bench.machine_noise"), ("postgres", "postgres"),
         ("benchmark", "bench.run"))
OTHER = "other"
Snapshot = Mapping[int, tuple[str, float]]  # pid: (role, CPU seconds so far)


def role_of(cmdline: str) -> str:
    """The role of the process with this command line (arguments joined by spaces)."""
    return next((role for role, mark in ROLES if mark in cmdline), OTHER)


def cpu_seconds(stat: str, ticks_per_s: float) -> float:
    """User and system CPU seconds from a /proc/<pid>/stat line (fields 14 and 15, counted after
    the parenthesised command name, which may itself hold spaces)."""
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def _snapshot() -> dict[int, tuple[str, float]]:
    """Each live process: its role and CPU seconds so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[str, float]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found[int(entry.name)] = (role_of(cmdline), cpu_seconds((entry / "stat").read_text(), ticks))
        except (OSError, ValueError, IndexError):
            continue  # it ended while being read
    return found


def by_role(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per role spent between two snapshots, by the processes in both."""
    spent: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        if pid in before:
            spent[role] = spent.get(role, 0.0) + seconds - before[pid][1]
    return {role: round(s, 2) for role, s in sorted(spent.items(), key=lambda kv: -kv[1])}


@dataclass
class Spent:
    """What `measured` fills in when its block ends: CPU seconds per role (empty without /proc)."""

    cpu_s: dict[str, float] = field(default_factory=dict)


@contextmanager
def measured() -> Iterator[Spent]:
    """Count the CPU every process spends while the block runs."""
    spent = Spent()
    before = _snapshot() if PROC.is_dir() else {}
    yield spent
    if before:
        spent.cpu_s = by_role(before, _snapshot())
