"""The offset tracker is shared by a member's poll loop, which assigns, dispatches and forgets
partitions, and its workers, which ask whether their record is still theirs: every reading is
taken under its lock, whatever the other thread is doing meanwhile."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from consumers.runtime.offsets import OffsetTracker

ROUNDS = 20_000


@pytest.fixture(autouse=True)
def switch_often() -> Iterator[None]:
    """Threads switch every microsecond, so that a reading without the lock meets a change."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def test_readings_from_a_worker_thread_meet_no_change_half_made() -> None:
    tracker = OffsetTracker()
    failures: list[BaseException] = []
    done = threading.Event()

    def poll_loop() -> None:
        """Partitions come and go, as rebalances move them."""
        try:
            for n in range(ROUNDS):
                tp = ("t", n % 64)
                tracker.assigned(tp)
                epoch = tracker.dispatched(tp, n)
                tracker.completed(tp, n, epoch)
                if n % 3 == 0:
                    tracker.releasing({tp})
                    tracker.forget({tp})
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)
        finally:
            done.set()

    def worker() -> None:
        try:
            while not done.is_set():
                tracker.owns(("t", 1), 1)
                tracker.in_flight()
                tracker.committable()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    threads = [threading.Thread(target=poll_loop), threading.Thread(target=worker)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
