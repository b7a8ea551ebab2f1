"""What a try of the AI client passes before it is sent, and is told how it ended.

Three gates, each optional, in this order: the endpoint's circuit (`consumers.ai.circuit`), the
minute's requests and tokens (`consumers.ai.rate_budget`), a permit of the concurrency limit
(`consumers.ai.limit`). A 429 goes to the gate it speaks of: a budget spent to the budget, a
full service to the limit, so a minute's budget running out never halves the concurrency.
A try that does not teach (a flex try: its latency and refusals are the flex pool's) spends the
budget but tells the limit and the circuit nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from consumers.ai.circuit import Circuit
from consumers.ai.limit import NOT_SENT, OK, OVERLOAD, AdaptiveLimit, Permit
from consumers.ai.rate_budget import REQUESTS, TOKENS, Estimate, RateBudget, Spent
from consumers.ai.waits import Cancelled

CONCURRENCY = "concurrency"  # a 429's kind when the service is full of calls at once
# Outcomes that may say something about the request itself. A 429 (the service is full for
# everyone) or a refused connection (no service at all) does not.
REQUEST_FAILURES = ("http_5xx", "timeout")


class Answer(Protocol):
    """What the gates read of a try's reply (`consumers.ai.client.Reply`)."""

    @property
    def outcome(self) -> str: ...
    @property
    def body(self) -> dict: ...
    @property
    def retry_after_s(self) -> float | None: ...
    @property
    def refusal(self) -> str | None: ...
    @property
    def headers(self) -> Mapping[str, str]: ...


class Admission:
    """The gates of one endpoint's tries; as thread-safe as each of them."""

    def __init__(self, circuit: Circuit | None = None, limiter: AdaptiveLimit | None = None,
                 budget: RateBudget | None = None) -> None:
        self.circuit, self.limiter, self.budget = circuit, limiter, budget
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Let no waiting try through any more (the fleet stops): each raises `Cancelled`."""
        self._stopping.set()
        if self.limiter is not None:
            self.limiter.wake()

    def admit(self, request: str, payload: Mapping[str, Any], teaches: bool = True) -> Admitted | None:
        """Let `request`'s try through, once its budget and a permit are free (it waits for
        them, `Cancelled` once stopped); None when the circuit holds it back. The permit is
        renewed: its thread may have waited to run since it was granted."""
        if self.circuit is not None and not self.circuit.admit(request):
            return None
        stopping = self._stopping
        taken = None
        if self.budget is not None:
            estimate = self.budget.estimate(payload)
            taken = estimate, self.budget.take(estimate.total, stopping)
        limiter = self.limiter
        try:
            permit = limiter.renew(limiter.acquire(stopping), stopping) if limiter is not None else None
        except Cancelled:
            if self.budget is not None and taken is not None:
                self.budget.ended(taken[1], answered=False)
            raise
        return Admitted(self, request, taken, permit, teaches)


@dataclass
class Admitted:
    """A try let through, and what it took of each gate until it ends."""

    admission: Admission
    request: str
    taken: tuple[Estimate, Spent] | None  # of the budget: the try's tokens as estimated, and what it spent
    permit: Permit | None
    teaches: bool = True  # its ending tells the limit and the circuit about the endpoint

    def sent(self) -> None:
        """The try goes out now (once on record): a call at the endpoint from here."""
        if self.admission.limiter is not None and self.permit is not None:
            self.permit = self.admission.limiter.sent(self.permit)

    def ended(self, reply: Answer, took: float) -> bool:
        """Give back what the try took, tell each gate what its reply says, and whether its
        failure is the request's own: the circuit's verdict, without one any of REQUEST_FAILURES.
        A try that raised ends unsent (`reply` still NOT_SENT), which teaches the gates nothing."""
        gates = self.admission
        if gates.limiter is not None and self.permit is not None:
            counts = self.teaches and (reply.outcome != OVERLOAD or reply.refusal == CONCURRENCY)
            gates.limiter.release(self.permit, reply.outcome if counts else NOT_SENT, reply.retry_after_s)
        if gates.budget is not None and self.taken is not None:
            budget, (estimate, spent) = gates.budget, self.taken
            budget.ended(spent, answered=reply.outcome == OK)
            if reply.outcome == OK:
                budget.observe(reply.headers, spent)
                budget.settle(spent, estimate, reply.body)
            elif reply.refusal in (REQUESTS, TOKENS):
                budget.refused(reply.refusal, reply.retry_after_s, reply.headers, spent)
        if not self.teaches:
            return False
        if gates.circuit is not None:
            return gates.circuit.ended(self.request, reply.outcome, took)
        return reply.outcome in REQUEST_FAILURES
