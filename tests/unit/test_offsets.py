"""Commit positions when records complete out of order, across reassignments."""

from __future__ import annotations

from consumers.runtime.offsets import OffsetTracker

TP = ("t", 0)


def test_position_stops_at_lowest_in_flight() -> None:
    tracker = OffsetTracker()
    epochs = {offset: tracker.dispatched(TP, offset) for offset in (10, 11, 12, 13)}
    tracker.completed(TP, 12, epochs[12])
    tracker.completed(TP, 10, epochs[10])
    assert tracker.committable() == {TP: 11}
    tracker.completed(TP, 11, epochs[11])
    assert tracker.committable() == {TP: 13}
    tracker.completed(TP, 13, epochs[13])
    assert tracker.committable() == {TP: 14}


def test_committed_positions_are_not_repeated() -> None:
    tracker = OffsetTracker()
    tracker.completed(TP, 0, tracker.dispatched(TP, 0))
    tracker.mark_committed(tracker.committable())
    assert tracker.committable() == {}
    epoch = tracker.dispatched(TP, 1)
    assert tracker.committable() == {}  # 1 is in flight: position still 1, already committed
    tracker.completed(TP, 1, epoch)
    assert tracker.committable() == {TP: 2}


def test_partitions_are_independent_and_forgettable() -> None:
    tracker = OffsetTracker()
    other = ("t", 1)
    tracker.dispatched(TP, 5)
    tracker.completed(other, 7, tracker.dispatched(other, 7))
    assert tracker.committable({other}) == {other: 8}
    assert tracker.in_flight() == 1
    assert tracker.in_flight({other}) == 0
    tracker.forget({TP})
    assert tracker.in_flight() == 0
    assert TP not in tracker.committable()


def test_a_record_given_back_unhandled_holds_the_position() -> None:
    tracker = OffsetTracker()
    epochs = {offset: tracker.dispatched(TP, offset) for offset in (0, 1, 2)}
    tracker.completed(TP, 0, epochs[0])
    tracker.completed(TP, 1, epochs[1], handled=False)
    tracker.completed(TP, 2, epochs[2])
    assert tracker.in_flight() == 0  # nothing runs any more ...
    assert tracker.committable() == {TP: 1}  # ... but the commit never passes offset 1


def test_completion_from_an_earlier_assignment_is_stale() -> None:
    tracker = OffsetTracker()
    tracker.assigned(TP)
    first = tracker.dispatched(TP, 4)
    tracker.forget({TP})  # lost while offset 4 was being processed
    second_assignment = tracker.assigned(TP)
    assert tracker.dispatched(TP, 4) == second_assignment != first
    assert not tracker.completed(TP, 4, first)  # the first copy finishing late changes nothing
    assert tracker.committable() == {TP: 4}
    assert tracker.completed(TP, 4, second_assignment)
    assert tracker.committable() == {TP: 5}


def test_releasing_stops_ownership_but_accepts_completions() -> None:
    tracker = OffsetTracker()
    epoch = tracker.assigned(TP)
    tracker.dispatched(TP, 0)
    assert tracker.owns(TP, epoch)
    tracker.releasing({TP})
    assert not tracker.owns(TP, epoch)  # retries stop ...
    assert tracker.completed(TP, 0, epoch)  # ... a call in progress still completes and commits
    assert tracker.committable() == {TP: 1}
