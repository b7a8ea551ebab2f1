"""The records in flight a fleet's flow members share."""

import threading

from consumers.runtime.window_pool import WindowPool


def test_a_member_may_start_what_the_others_leave_of_the_pool() -> None:
    pool = WindowPool(8)
    assert pool.free("a", 3) == 5  # alone in the pool with 3 out
    assert pool.free("b", 2) == 3  # 8 - 3 (a) - 2 (its own)
    pool.hold("a", 0)  # a's records finished
    assert pool.free("b", 2) == 6


def test_a_report_replaces_the_last_one_so_unused_room_comes_back() -> None:
    pool = WindowPool(4)
    pool.hold("a", 4)  # a took the whole pool ...
    assert pool.free("b", 0) == 0
    pool.hold("a", 1)  # ... and only one of its records is still out
    assert pool.free("b", 0) == 3


def test_free_is_never_negative_when_members_took_past_the_size_together() -> None:
    pool = WindowPool(4)
    pool.hold("a", 3)
    pool.hold("b", 3)  # both asked at once and started 3
    assert pool.free("c", 0) == 0


def test_what_a_member_takes_is_held_for_it_before_it_reports() -> None:
    pool = WindowPool(16)
    assert pool.take("a", 4, wanted=20) == 12  # 16 - its own 4
    assert pool.take("b", 0, wanted=8) == 0  # asked before a started its 12: none left
    pool.hold("a", 10)  # a started only 6 of them
    assert pool.take("b", 0, wanted=8) == 6


def test_members_taking_at_once_never_start_more_than_the_pool() -> None:
    pool, started = WindowPool(16), {}
    barrier = threading.Barrier(4)

    def member(name: str) -> None:
        barrier.wait()
        out = 0
        for _ in range(3):  # asks again with what it started, as a member's next dispatch does
            out += pool.take(name, out, wanted=16)
        started[name] = out

    threads = [threading.Thread(target=member, args=(f"m{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(started.values()) == 16
