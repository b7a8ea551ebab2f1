"""Commit positions when records complete out of order."""

from __future__ import annotations

from consumers.offsets import OffsetTracker

TP = ("t", 0)


def test_position_stops_at_lowest_in_flight() -> None:
    tracker = OffsetTracker()
    for offset in (10, 11, 12, 13):
        tracker.dispatched(TP, offset)
    tracker.completed(TP, 12)
    tracker.completed(TP, 10)
    assert tracker.committable() == {TP: 11}
    tracker.completed(TP, 11)
    assert tracker.committable() == {TP: 13}
    tracker.completed(TP, 13)
    assert tracker.committable() == {TP: 14}


def test_committed_positions_are_not_repeated() -> None:
    tracker = OffsetTracker()
    tracker.dispatched(TP, 0)
    tracker.completed(TP, 0)
    tracker.mark_committed(tracker.committable())
    assert tracker.committable() == {}
    tracker.dispatched(TP, 1)
    assert tracker.committable() == {}  # 1 is in flight: position still 1, already committed
    tracker.completed(TP, 1)
    assert tracker.committable() == {TP: 2}


def test_partitions_are_independent_and_forgettable() -> None:
    tracker = OffsetTracker()
    other = ("t", 1)
    tracker.dispatched(TP, 5)
    tracker.dispatched(other, 7)
    tracker.completed(other, 7)
    assert tracker.committable({other}) == {other: 8}
    assert tracker.in_flight() == 1
    assert tracker.in_flight({other}) == 0
    tracker.forget({TP})
    assert tracker.in_flight() == 0
    assert TP not in tracker.committable()
