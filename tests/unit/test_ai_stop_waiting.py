"""A fleet that stops sends no try still waiting at its gates: each wait ends in `Cancelled`."""

from __future__ import annotations

import threading

import pytest

from consumers.ai.admission import Admission
from consumers.ai.limit import AdaptiveLimit
from consumers.ai.rate_budget import RateBudget
from consumers.ai.waits import Cancelled


def waiting_admit(admission: Admission) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def admit() -> None:
        try:
            admission.admit("r1", {"text": "x"})
        except Cancelled as exc:
            raised.append(exc)

    thread = threading.Thread(target=admit)
    thread.start()
    return thread, raised


def test_a_try_waiting_for_a_permit_is_not_sent_once_stopped() -> None:
    limiter = AdaptiveLimit.fixed(1)
    held = limiter.acquire()
    admission = Admission(limiter=limiter)
    thread, raised = waiting_admit(admission)
    while limiter.waiters() != (1, 1):  # the try waits on the limit
        threading.Event().wait(0.001)
    admission.stop()
    thread.join(timeout=5)
    assert not thread.is_alive() and len(raised) == 1
    assert limiter.in_flight == 1  # only the permit held before: the cancelled try took none
    limiter.release(held, "not_sent")


def test_a_try_waiting_for_a_minute_s_budget_is_not_sent_once_stopped() -> None:
    budget = RateBudget(requests_per_minute=1)  # one request a minute: the second waits ~60 s
    _, first = budget.try_take(1)
    assert first is not None
    admission = Admission(budget=budget)
    thread, raised = waiting_admit(admission)
    while budget.usage()[0] != 1:
        threading.Event().wait(0.001)
    admission.stop()
    thread.join(timeout=5)
    assert not thread.is_alive() and len(raised) == 1
    assert budget.usage() == (0, {"requests": 1.0, "tokens": 1.0})  # nothing taken by the cancelled try


def test_a_try_that_took_its_budget_gives_it_back_when_its_permit_wait_is_cancelled() -> None:
    limiter, budget = AdaptiveLimit.fixed(1), RateBudget(requests_per_minute=10)
    held = limiter.acquire()
    admission = Admission(limiter=limiter, budget=budget)
    thread, raised = waiting_admit(admission)
    while limiter.waiters() != (1, 1):
        threading.Event().wait(0.001)
    admission.stop()
    thread.join(timeout=5)
    assert len(raised) == 1
    # its request was taken, then ended unanswered: out of the budget's tries in flight again
    assert budget._out == pytest.approx({"requests": 0.0, "tokens": 0.0})
    limiter.release(held, "not_sent")
