"""The records in flight a fleet's flow members share."""

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
