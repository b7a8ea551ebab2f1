"""What a stage does with one valid event, as its pipeline spec says (`consumers.config.pipeline_spec`).

Every stage of every pipeline runs the same steps:

1. take the request: merge the fields the stage records into the request row (creating it if
   this event arrives first) and move its status forward;
2. a join stage stops here until every field it waits for is on the row;
3. the work: none, a Python callable, or an AI call;
4. record the result, once, with the status its routes give the request;
5. hand the outcome for every route whose condition holds to the outbox (`consumers.runtime.outbox`):
   sent and acknowledged now, or in the transaction that commits the record's offset.

At most one AI call per (pipeline, key, stage): before calling, the stage claims the triple in
PostgreSQL as it takes the request (`Storage.take` with a `CallClaim`), so a second copy of the
same request waits for the first one's result instead of calling too, and a member that died
mid-call is taken over once its lease expires. Every try is written before it is sent and
completed after, so an interrupted call is still counted. A stage whose result is already
recorded does not call again but re-sends its routes' events, which is idempotent downstream:
an event lost between the two writes is therefore never lost.

Failures raise; `consumers.runtime.failures` says which are the record's fault (dead-lettered) and
which are a dependency's (retried). A request's own AI failures are counted per (request, stage,
redrive round) across handlings, from its attempt rows, against the stage's `max_attempts`; an
endpoint whose circuit is open holds a record back before it takes its claim, so a record that
waits for it writes nothing meanwhile. What one record's handling achieved is kept in its
`RecordState` across those retries, so a retry after the database came back stores the AI
answer already received rather than calling again.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from consumers.ai.client import AIBadAnswer, AIClient, AIUnavailable, AIWaiting, EndpointDown, Flex, Try
from consumers.ai.limit import NOT_SENT, OK
from consumers.ai.tier_choice import BATCH, FLEX
from consumers.canary.loans import LoanStore
from consumers.config import pipeline_spec
from consumers.config.events import InvalidEvent, Topics, encode
from consumers.config.http_work import RenderError
from consumers.config.pipeline_spec import HttpWork, PythonWork, Route, StageSpec
from consumers.kafka_clients.producer import key_for
from consumers.runtime.failures import ClaimHeld, Transient, WorkFailed
from consumers.runtime.outbox import Outbox, Outgoing
from consumers.runtime.storage import CallClaim, Claim, Ended, Key, Line, Origin, Parked, Status, Storage
from consumers.runtime.tier_router import TierRouter
from consumers.runtime.window_pool import WindowPool

TEMPLATE_FAILED = "request_template"  # the dead letter's reason: the event lacks what the request needs
ANSWERED = "answered"  # a batch line's state once its answer is in


@dataclass
class StageContext:
    """Everything a stage handler needs; shared by the members of one fleet (a member whose
    outputs go out in its own transactions has a copy with its own `outbox`)."""

    stage: str
    topics: Topics
    storage: Storage
    outbox: Outbox
    key_strategy: str = "uuid"  # keys of the events the stage sends downstream
    ai: AIClient | None = None  # the stage's endpoint, when its work is an AI call
    claim_lease_s: float = 30.0  # longer than one try plus the backoff before the next
    windows: WindowPool | None = None  # flow: the members' windows, pooled
    loans: LoanStore | None = None  # flow: partitions lent to a canary (consumers.canary.loans)
    router: TierRouter | None = None  # a stage whose records may go to a cheaper, later tier

    @property
    def spec(self) -> StageSpec:
        return self.topics.spec.stages[self.stage]

    @property
    def entry(self) -> bool:
        return self.stage in self.topics.spec.entry_stages

    def key(self, event: dict[str, Any]) -> Key:
        return Key(self.topics.spec.name, event[self.topics.spec.key], event["run_id"])

    def status(self, name: str | None, route: bool) -> Status | None:
        """A status ranked by the stage's place in the spec (a route's above the stage's own)."""
        if name is None:
            return None
        rank = 2 * self.topics.spec.stage_names.index(self.stage) + int(route)
        return Status(name, rank, settles=name in pipeline_spec.TERMINAL_STATUSES)

    def outgoing(self, topic: str, event: dict[str, Any]) -> Outgoing:
        """The record that carries `event` to the pipeline's topic `topic`."""
        return Outgoing(self.topics.name(topic), encode(event), key_for(self.key_strategy, event))


@dataclass
class RecordState:
    """What handling one record has achieved so far, kept across its retries."""

    owner: str = field(default_factory=lambda: uuid.uuid4().hex)  # this handling's claim owner
    result: dict[str, Any] | None = None  # the work's kept fields, once received
    failure: AIUnavailable | AIBadAnswer | None = None  # the AI's final failure, once known
    work_failures: int = 0  # exceptions the stage's Python work raised on this record
    tries: list[Try] = field(default_factory=list)
    unwritten: list[Ended] = field(default_factory=list)  # tries whose attempt rows are not completed
    recorded_first: bool = False  # this handling recorded the stage's result
    skipped_duplicate: bool = False


def handle(ctx: StageContext, event: dict[str, Any], origin: Origin, state: RecordState) -> None:
    """Run the stage's steps for one validated event."""
    spec, key = ctx.spec, ctx.key(event)
    endpoint = spec.work.endpoint if isinstance(spec.work, HttpWork) else None
    calls = endpoint is not None and state.result is None and state.failure is None
    flex = None
    if calls and ctx.router is not None:
        line, flex = _later_tier(ctx, key, event, origin)
        if line is not None and line.waiting:  # the batch's now: the offset can be committed
            ctx.storage.take(key, event["produced_at"], {f: event[f] for f in spec.record if f in event},
                             ctx.status(spec.status, route=False))
            return
        if line is not None and line.state == ANSWERED:
            _batch_result(spec.work, line, state)
            calls = False
    if calls:
        if ctx.ai is None:
            raise RuntimeError(f"stage {ctx.stage} has no URL for endpoint {endpoint}")
        if ctx.ai.circuit is not None and ctx.ai.circuit.closed_to(key.request_id):
            raise EndpointDown(f"{endpoint} is down for every caller (circuit {ctx.ai.circuit.state})")
    row, claim = ctx.storage.take(key, event["produced_at"], {f: event[f] for f in spec.record if f in event},
                                  ctx.status(spec.status, route=False),
                                  CallClaim(ctx.stage, state.owner, ctx.claim_lease_s, origin, spec.join)
                                  if calls else None)
    if any(f not in row for f in spec.join):
        return  # the other half of the join records it
    outcome = {**event, **row} if spec.join else dict(event)
    _work(ctx, spec, key, outcome, origin, state, claim, flex)
    outcome.update(state.result or {})
    routes = [r for r in spec.routes if r.matches(outcome)]
    status = next((ctx.status(r.status, route=True) for r in routes if r.status), None)
    state.recorded_first = ctx.storage.record_result(key, ctx.stage, state.result, origin, status,
                                                     ctx.entry, state.unwritten) or state.recorded_first
    state.unwritten.clear()
    ctx.outbox.deliver(origin, [ctx.outgoing(route.to, message(route, ctx.topics.spec.key, key, outcome))
                                for route in routes if state.recorded_first or not route.once],
                       key if status is not None and status.settles else None)


def _later_tier(ctx: StageContext, key: Key, event: dict[str, Any],
                origin: Origin) -> tuple[Line | None, Flex | None]:
    """The record's batch line: parked now when the router sends it to the batch tier, found
    when an earlier handling parked it (this is a copy, or the keeper sent it back settled).
    Without a line, the flex try of a record the router sends to the flex tier. A record
    without a deadline has neither, and no database round trip is spent on it."""
    assert ctx.router is not None and isinstance(ctx.spec.work, HttpWork)
    if ctx.router.deadline_at(event) is None:
        return None, None
    work = ctx.spec.work
    endpoint = ctx.topics.spec.endpoints[work.endpoint]
    try:
        body = work.payload(event, ctx.topics.spec.key, endpoint.model)
    except RenderError:
        body = None  # the realtime path dead-letters it
    choice = ctx.router.choose(event, body, time.time()) if body is not None else None
    parked = (Parked(event, body, choice.deadline_at, choice.fallback_at)
              if choice is not None and body is not None and choice.tier == BATCH else None)
    line = ctx.storage.park(key, ctx.stage, origin, parked)
    if line is None and choice is not None and choice.tier == FLEX and endpoint.tiers.flex is not None:
        return None, Flex(endpoint.tiers.flex.fields, choice.fallback_at)
    return line, None


def _batch_result(work: HttpWork | PythonWork | None, line: Line, state: RecordState) -> None:
    """The kept fields of the batch's answer, or the record's failure when it lacks them."""
    assert isinstance(work, HttpWork) and line.answer is not None
    kept, missing = work.result(line.answer)
    if missing:
        state.failure = AIBadAnswer(f"batch answer from {work.endpoint} without {missing}")
    else:
        state.result = kept


def message(route: Route, key_field: str, key: Key, outcome: dict[str, Any]) -> dict[str, Any]:
    """The event a route sends: the outcome forwarded, or a new one with the route's fields."""
    if route.forward:
        return outcome
    fields = {name: outcome.get(value[1:]) if isinstance(value, str) and value.startswith("$") else value
              for name, value in route.fields.items()}
    return {key_field: key.request_id, "run_id": key.run_id, **fields, "at": time.time()}


def _work(ctx: StageContext, spec: StageSpec, key: Key, outcome: dict[str, Any], origin: Origin,
          state: RecordState, claim: Claim | None, flex: Flex | None) -> None:
    """Put the work's kept fields in `state.result`, unless an earlier try of the record did
    (a stage without work keeps none); an AI call tries `flex` first."""
    if isinstance(spec.work, PythonWork) and state.result is None:
        state.result = _python_result(spec.work, spec.retry.max_attempts, outcome, state)
    elif isinstance(spec.work, HttpWork):
        _ai_result(ctx, spec.work, key, outcome, origin, state, claim, flex)


class WorkRetrying(Transient):
    """The stage's Python work raised on the record: it is tried again, up to the stage's tries."""


class WorkWaiting(Transient):
    """The stage's Python work raised an exception its spec declares a dependency's."""


def _python_result(work: PythonWork, max_attempts: int, event: dict[str, Any],
                   state: RecordState) -> dict[str, Any]:
    """The work's result fields; what it raises is the record's failure (see `PythonWork`)."""
    try:
        return dict(pipeline_spec.resolve(work.callable)(event))
    except Exception as exc:  # the team's code: whatever it raises is this record's failure
        if isinstance(exc, work.transient_classes):
            raise WorkWaiting(f"{work.callable}: {exc!r}") from exc
        state.work_failures += 1
        if state.work_failures < max_attempts:
            raise WorkRetrying(f"{work.callable} failed ({state.work_failures} of {max_attempts} "
                               f"tries): {exc!r}") from exc
        raise WorkFailed(exc) from exc


@dataclass
class _AttemptLog:
    """Puts each try on record as sent right before it is sent (renewing the claim) and keeps
    its ending. The first try's row was written with the claim (`_ids` starts with it)."""

    ctx: StageContext
    key: Key
    origin: Origin
    state: RecordState
    _ids: dict[int, int]

    def started(self, attempt: int, at: float) -> None:
        self._ids[attempt] = self.ctx.storage.start_attempt(
            self.key, self.ctx.stage, self.origin, self.state.owner, self.ctx.claim_lease_s,
            attempt, at, row=self._ids.get(attempt))

    def ended(self, attempt: Try) -> None:
        self.state.tries.append(attempt)
        if attempt.tier == FLEX and attempt.outcome == OK and self.ctx.router is not None:
            self.ctx.router.flex_answered(attempt.ended - attempt.started)
        usage = attempt.usage
        self.state.unwritten.append(Ended(self._ids[attempt.attempt], attempt.started, attempt.ended,
                                          attempt.outcome, attempt.http_status, attempt.own,
                                          usage.tokens_input, usage.tokens_output, usage.reported_cost,
                                          attempt.tier))


def _ai_result(ctx: StageContext, work: HttpWork, key: Key, event: dict[str, Any], origin: Origin,
               state: RecordState, claim: Claim | None, flex: Flex | None) -> None:
    """The stage's kept AI answer: recorded already (`claim.done`; the skip is on record),
    received by an earlier try of the record (kept even when writing its attempt rows failed,
    and then there is no `claim`), or called for now. The tries' attempt rows are completed here
    when they end in a failure, else with the result that they got."""
    if claim is not None:
        if claim.done is not None:
            state.skipped_duplicate = True
            state.result = claim.done
            return
        if claim.first_attempt is None:
            raise ClaimHeld(f"{ctx.stage} of {key.request_id} is being called by another member")
        assert ctx.ai is not None  # a claim to call is taken only with the stage's client (`handle`)
        own = max(claim.own_failures, sum(t.own for t in state.tries))
        log = _AttemptLog(ctx, key, origin, state, {1: claim.first_attempt})
        try:
            payload = work.payload(event, ctx.topics.spec.key, ctx.topics.spec.endpoints[work.endpoint].model)
        except RenderError as exc:  # nothing to send: the row written with the claim ends unsent
            now = time.time()
            log.ended(Try(1, now, now, NOT_SENT, None))
            ctx.storage.end_attempts(state.unwritten)
            state.unwritten.clear()
            raise InvalidEvent(TEMPLATE_FAILED, str(exc)) from None
        try:
            body = ctx.ai.call(payload, log, request=key.request_id,
                               budget=ctx.ai.policy.max_attempts - own, flex=flex)
        except (AIUnavailable, AIBadAnswer) as exc:
            state.failure = exc  # the request's own fault
        except AIWaiting:
            ctx.storage.end_attempts(state.unwritten)
            state.unwritten.clear()
            raise
        else:
            kept, missing = work.result(body)
            if missing:
                state.failure = AIBadAnswer(f"answer from {work.endpoint} without {missing}")
            else:
                state.result = kept
    if state.failure is not None:
        ctx.storage.end_attempts(state.unwritten)
        state.unwritten.clear()
        raise state.failure
