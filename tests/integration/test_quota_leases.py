"""One quota's leases on the stack's PostgreSQL, renewed by holders in processes of their own:
the grants follow the weights, never sum past the quota (read back from the renewals' rows),
and a killed holder's share goes to the others only once its lease and drain are over."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator

import psycopg2
import pytest

from consumers.quota.leases import CALLS, Holder, LeaseStore, Limits
from tests.stack import Stack, unique

CAPACITY = 64
LEASE_S, DRAIN_S = 1.0, 1.0


def renew_forever(database_url: str, who: Holder) -> None:
    """A holder whose callers always wait: it asks for more than the whole quota, every 0.1 s,
    and has all it may use out (a call ending between renewals is replaced at once)."""
    store, using = LeaseStore(database_url), 0
    while True:
        using = int(store.renew(who, Limits(calls=CAPACITY), {CALLS: 100.0}, in_use=using)[CALLS])
        time.sleep(0.1)


@pytest.fixture
def holders(stack: Stack) -> Iterator[tuple[str, dict[str, multiprocessing.process.BaseProcess]]]:
    quota = unique("quota")
    spawn = multiprocessing.get_context("spawn")
    processes = {}
    for name, weight in (("a", 2.0), ("b", 1.0), ("c", 1.0)):
        who = Holder(quota, name, f"pipeline-{name}", "stage", quota, "standard", weight, LEASE_S, DRAIN_S)
        processes[name] = spawn.Process(target=renew_forever, args=(stack.database_url, who), daemon=True)
        processes[name].start()
    yield quota, processes
    for process in processes.values():
        process.kill()
        process.join(10)


def history(database_url: str, quota: str) -> list[tuple[float, str, int]]:
    """Every renewal of the quota: (at, holder, calls granted), in commit order of the lock."""
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM at), holder, granted_calls FROM quota_history "
                    "WHERE quota = %s ORDER BY at, holder", (quota,))
        return [(float(at), holder, calls) for at, holder, calls in cur.fetchall()]


def sums_over_time(rows: list[tuple[float, str, int]], gone: dict[str, float]) -> list[int]:
    """The grants' sum after each renewal, each holder at its latest grant, a holder in `gone`
    at nothing from the time given (its claim released)."""
    latest: dict[str, int] = {}
    sums = []
    for at, holder, calls in rows:
        latest[holder] = calls
        sums.append(sum(g for h, g in latest.items() if at < gone.get(h, float("inf"))))
    return sums


def latest(rows: list[tuple[float, str, int]]) -> dict[str, int]:
    return {holder: calls for _, holder, calls in rows}


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_shares_follow_the_weights_and_move_only_within_the_quota(stack: Stack, holders) -> None:
    quota, processes = holders
    wait_for(lambda: latest(history(stack.database_url, quota)) == {"a": 32, "b": 16, "c": 16})
    before_kill = time.time()
    os.kill(processes["c"].pid, signal.SIGKILL)
    # c's 16 go to a and b by their weights once its lease (1 s) and drain (1 s) are over.
    # 64 by 2 : 1 is 42.7 and 21.3: the call left over goes to the larger remainder, a's.
    wait_for(lambda: latest(history(stack.database_url, quota)) == {"a": 43, "b": 21, "c": 16})
    rows = history(stack.database_url, quota)
    c_last = max(at for at, holder, _ in rows if holder == "c")
    assert max(sums_over_time(rows, gone={"c": c_last + LEASE_S + DRAIN_S})) <= CAPACITY
    grown = min(at for at, holder, calls in rows if holder == "a" and calls > 32 and at > before_kill)
    assert grown - c_last >= LEASE_S + DRAIN_S - 0.05
