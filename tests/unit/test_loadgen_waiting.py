"""A share of the load's requests told they may wait: the spec's deadline fields set on the
first event of each such request, which its index fixes."""

from __future__ import annotations

from consumers.loadgen.source import Waiting


def test_seven_in_every_ten_wait_at_a_share_of_0_7() -> None:
    waiting = Waiting(0.7, 7200.0)
    # floor(0.7 (i + 1)) > floor(0.7 i): i = 0: 0 > 0 no; 1: 1 > 0; 2: 2 > 1; 3: 2 > 2 no; 4: 3 > 2;
    # 5: 4 > 3; 6: 4 > 4 no; 7: 5 > 4; 8: 6 > 5; 9: 7 > 6
    assert [i for i in range(10) if waiting.waits(i)] == [1, 2, 4, 5, 7, 8, 9]
    assert sum(waiting.waits(i) for i in range(1000)) == 700  # the floors telescope to floor(700)
    assert not any(Waiting(0.0, 1.0).waits(i) for i in range(10))
    assert all(Waiting(1.0, 1.0).waits(i) for i in range(10))


def test_a_waiting_request_gets_every_deadline_field_on_its_first_event_only() -> None:
    request = [("intake", {"id": 1}), ("style", {"id": 1})]
    Waiting(0.7, 7200.0).apply(1, ["answer_within_s", "due_s"], request)
    assert request == [("intake", {"id": 1, "answer_within_s": 7200.0, "due_s": 7200.0}),
                       ("style", {"id": 1})]
    alone = [("tickets", {"id": 2})]
    Waiting(0.7, 7200.0).apply(0, ["answer_within_s"], alone)
    assert alone == [("tickets", {"id": 2})]
