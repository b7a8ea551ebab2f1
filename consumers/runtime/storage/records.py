"""What every write of the run records names: the request (`Key`), where its record came from
(`Origin`), the status it moves to, the claim of a stage's AI call and a try's ending."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from consumers.runtime.failures import Transient


@dataclass(frozen=True)
class Origin:
    """Where a record came from: who processed which offset, in which redrive round (0 for a
    record as first produced; see `consumers.runs.redrive`)."""

    member: str
    topic: str
    partition: int
    offset: int
    redrive: int = 0


@dataclass(frozen=True)
class Key:
    """Which request of which pipeline: every write names one."""

    pipeline: str
    request_id: str
    run_id: str


@dataclass(frozen=True)
class Status:
    """A status and its rank; `settles` when it is completed or rejected."""

    name: str
    rank: int
    settles: bool = False


@dataclass(frozen=True)
class Claim:
    """The answer to a claim: the stage's recorded result, or the call is ours to make (then
    `first_attempt` is the id of the first try's attempt row, written with the claim), or
    neither: another member holds the claim."""

    done: dict[str, Any] | None = None
    first_attempt: int | None = None
    own_failures: int = 0  # the request's own failed tries at this stage in this redrive round


@dataclass(frozen=True)
class CallClaim:
    """What a stage about to call its AI claims as it takes the request (`Storage.take`): the
    (key, stage) for `owner`, for `lease_s`, once every field of `join` is on the row."""

    stage: str
    owner: str
    lease_s: float
    origin: Origin
    join: Sequence[str] = ()


@dataclass(frozen=True)
class Parked:
    """A record a stage parks for the batch tier (`Storage.park`): its event, sent to the stage
    again once the line is settled, the request its line carries and its times (epoch s)."""

    event: dict[str, Any]
    body: dict[str, Any]
    deadline_at: float
    fallback_at: float


@dataclass(frozen=True)
class Line:
    """A parked record's line as `Storage.park` finds it: `state` (pending, submitted, answered,
    fallen_back) and, answered, the answer's body."""

    state: str
    answer: dict[str, Any] | None = None

    @property
    def waiting(self) -> bool:
        """Still the batch's: a copy of the record has nothing to do."""
        return self.state in ("pending", "submitted")


class ClaimLost(Transient):
    """The lease ran out and another member took the claim over."""


def ts(epoch_s: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch_s, UTC) if epoch_s is not None else None



class Ended(NamedTuple):
    """A try's ending, for its attempt row. The row was written before the try waited for a
    permit; `sent` makes its duration the call's. Tokens and cost are what its answer said
    (`consumers.ai.client.Usage`), None where it said nothing."""

    row: int  # the attempt row's id
    sent: float
    at: float
    outcome: str
    http_status: int | None
    own: bool  # the request's own failure
    tokens_input: int | None = None
    tokens_output: int | None = None
    reported_cost: float | None = None
    tier: str = "realtime"  # the price tier it was asked at
