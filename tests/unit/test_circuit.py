"""An endpoint's circuit on a clock of the test's: outages open it, a request's own failures and
scattered errors do not, one probe at a time closes it again. Expectations worked out by hand
from SAMPLE = 20, MIN_REQUESTS = 3, OPEN_S = 0.5 s, OPEN_MAX_S = 2 s, WINDOW_S = 30 s."""

from __future__ import annotations

import pytest

from consumers.ai.circuit import CLOSED, HALF_OPEN, OPEN, Circuit
from tests.hand_clock import HandClock


@pytest.fixture
def clock() -> HandClock:
    return HandClock(100.0)


def served(circuit: Circuit, requests: range | list[str], latency_s: float = 0.5) -> None:
    for request in requests:
        assert circuit.ended(str(request), "ok", latency_s) is False


def test_an_outage_after_steady_traffic_opens_at_the_twentieth_failure(clock: HandClock) -> None:
    circuit = Circuit(clock=clock)
    served(circuit, range(20))
    # The last 20 calls hold k failures and 20 - k answers: open once all 20 failed.
    own = [circuit.ended(f"f{i}", "http_5xx", 0.5) for i in range(20)]
    assert own == [True] * 19 + [False]  # the failure that opened it is the endpoint's, not f19's
    assert circuit.state == OPEN and circuit.openings == 1
    assert circuit.ended("f18", "timeout", 0.5) is False  # failures after it opened neither
    assert not circuit.admit("f0") and circuit.closed_to("f0")


@pytest.mark.parametrize("failing", [2, 12, 19])  # 10 %, 60 %, 95 % of the calls
def test_scattered_errors_never_open_it(clock: HandClock, failing: int) -> None:
    circuit = Circuit(clock=clock)
    for round_ in range(50):
        for i in range(20):
            request = f"{round_}-{i}"
            outcome = "http_5xx" if i >= 20 - failing else "ok"  # any 20 in a row: `failing` fail
            assert circuit.ended(request, outcome, 0.5) is (outcome != "ok")
            clock.now += 0.05
    assert circuit.state == CLOSED and circuit.openings == 0


def test_one_or_two_requests_failing_alone_are_their_own_business(clock: HandClock) -> None:
    circuit = Circuit(clock=clock)
    assert all(circuit.ended(request, "http_5xx", 0.5) for request in ["a", "b"] * 10)
    assert circuit.state == CLOSED
    assert not circuit.serving()  # nothing answered: no sign that the endpoint serves others
    served(circuit, ["c"])
    assert circuit.serving()


def test_three_requests_failing_with_nothing_served_open_it(clock: HandClock) -> None:
    circuit = Circuit(clock=clock)
    assert [circuit.ended(r, "connection_error", 0.0) for r in "abc"] == [True, True, False]
    assert circuit.state == OPEN


def test_calls_older_than_the_window_are_forgotten(clock: HandClock) -> None:
    circuit = Circuit(clock=clock)
    circuit.ended("a", "http_5xx", 0.5)
    circuit.ended("b", "http_5xx", 0.5)
    clock.now += 31  # WINDOW_S = 30 s later, a and b say nothing of the endpoint now
    assert circuit.ended("c", "http_5xx", 0.5) is True
    assert circuit.state == CLOSED


def test_429s_and_calls_not_sent_say_nothing_of_its_health(clock: HandClock) -> None:
    circuit = Circuit(clock=clock)
    for request in "abcdef":
        assert circuit.ended(request, "http_429", 0.01) is False
        assert circuit.ended(request, "not_sent", 0.0) is False
    assert circuit.state == CLOSED


def open_circuit(clock: HandClock) -> Circuit:
    circuit = Circuit(clock=clock)
    served(circuit, ["warm"], latency_s=0.4)  # probe patience: 3 x 0.4 = 1.2 s
    for request in "abcdefghijklmnopqrstu":
        circuit.ended(request, "http_5xx", 0.4)
        if circuit.state == OPEN:
            break
    assert circuit.state == OPEN
    return circuit


def test_one_probe_at_a_time_after_the_open_time(clock: HandClock) -> None:
    circuit = open_circuit(clock)
    clock.now += 0.49
    assert not circuit.admit("a")
    clock.now += 0.01
    assert circuit.state == HALF_OPEN
    assert not circuit.closed_to("a")  # asking reserves nothing
    assert circuit.admit("a")  # the probe
    assert not circuit.admit("b") and circuit.closed_to("b")
    assert circuit.admit("a")  # the probe's own next try
    served(circuit, ["a"])
    assert circuit.state == CLOSED and circuit.admit("b") and circuit.serving()


def test_a_failed_probe_opens_it_for_twice_as_long_up_to_two_seconds(clock: HandClock) -> None:
    circuit = open_circuit(clock)
    for open_s in (1.0, 2.0, 2.0):  # after 0.5 s, then doubled, capped
        clock.now += 3.0
        assert circuit.admit("a")
        assert circuit.ended("a", "timeout", 10.0) is False  # a probe's failure is the endpoint's
        assert circuit.state == OPEN
        clock.now += open_s - 0.01
        assert circuit.state == OPEN
        clock.now += 0.01
        assert circuit.state == HALF_OPEN


def test_a_probe_that_hangs_lets_the_next_one_go_after_three_latencies(clock: HandClock) -> None:
    circuit = open_circuit(clock)
    clock.now += 0.5
    assert circuit.admit("a")
    clock.now += 1.1
    assert not circuit.admit("b")
    clock.now += 0.2
    assert circuit.admit("b")  # "a" has been out for more than 3 x 0.4 s
    served(circuit, ["b"])
    assert circuit.state == CLOSED
    assert circuit.ended("a", "timeout", 10.0) is True  # one late failure alone does not reopen it
    assert circuit.state == CLOSED


def test_transitions_are_kept_for_the_record(clock: HandClock) -> None:
    circuit = open_circuit(clock)
    clock.now += 0.5
    circuit.admit("a")
    served(circuit, ["a"])
    assert [state for _, state, _ in circuit.changes] == [OPEN, HALF_OPEN, CLOSED]
