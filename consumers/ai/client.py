"""HTTP client for the AI services, with the retry policy the pipeline relies on.

A call is retried on 429 (waiting at least the server's `Retry-After`), on 5xx, on timeouts
and on connection errors, with exponential backoff and full jitter; any other 4xx is final.
Every try is reported to an observer before it is sent and after it ends (the consumer
writes one attempt row ahead of the call and completes it after).

Whose fault a failed try is decides how far a call goes. With a `consumers.ai.circuit.Circuit`,
a try goes out only while the endpoint's circuit admits it, and a failure counts against the
request only when the circuit says it was the request's own (see there); without one, every 5xx
and timeout does. A call stops when the request's own failures reach its `budget` (what the
stage's `max_attempts` leaves of it across handlings): `AIUnavailable` when the endpoint serves
others meanwhile, so the request can be dead-lettered, else `AIWaiting`, as for any failing
dependency. A call that spent `max_attempts` tries without that (429s, refused connections, the
circuit open) raises `AIWaiting` too. A 2xx that is not JSON raises `AIBadAnswer`. With a
`consumers.ai.limit.AdaptiveLimit`, each try first takes a permit from it and tells it
how the try ended, so the calls in flight follow the limit the service shows. With a
`consumers.ai.rate_budget.RateBudget`, each try first spends its share of the minute's requests and
tokens. A try passes the three through one `consumers.ai.admission.Admission`. A 429 is read by
its kind (`refusal_kind`): a budget spent goes to the budget, a full service to the limit, so a
minute's budget running out never halves the concurrency.

Each try keeps what its answer says it used (`Usage`): the tokens of an OpenAI-compatible
`usage` and the cost a gateway reports, which the attempt rows keep for `measure.cost`. A try
cut off after its answer's status line arrived keeps that status (and the headers), so the cost
figures can tell an answer the provider began from one it refused. How long a try may take is
the `consumers.ai.learned_timeout.LearnedTimeout` in force (fixed at the endpoint's timeout
without one): a try the client gives up on is still answered, and billed, by a hosted API.

A call may first try the endpoint's flex tier (`Flex`): the same request asked for at a lower
price, slower, refused when the provider is short of flex capacity. That one try is given until
the record's fallback time; refused, failed or not answered by then, the call goes on realtime
at once. The flex try is not the request's failure, and it teaches the limit, the circuit and
the learned timeout nothing (its latency and its refusals are the flex pool's, not the
endpoint's); it spends the minute's budget as any call does.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import urllib3
from urllib3.connection import HTTPConnection

from consumers.ai.admission import Admission, Admitted
from consumers.ai.circuit import Circuit
from consumers.ai.learned_timeout import LearnedTimeout
from consumers.ai.limit import NOT_SENT, OK, OVERLOAD, AdaptiveLimit
from consumers.ai.rate_budget import RateBudget, header_number
from consumers.ai.reply import Reply, Usage, refusal_kind
from consumers.ai.tier_choice import FLEX, REALTIME
from consumers.ai.waits import Cancelled


@dataclass(frozen=True)
class Endpoint:
    """Where and how to call one AI service, as for a real endpoint."""

    url: str
    timeout_s: float = 10.0  # the most one try may take (a `LearnedTimeout` keeps under it)
    auth_header: str | None = None  # full header value, e.g. "Bearer <token>"
    headers: Mapping[str, str] = field(default_factory=dict)  # the endpoint's own, e.g. an API version


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    backoff_base_s: float = 0.2
    backoff_max_s: float = 5.0

    def backoff(self, attempt: int, retry_after_s: float | None, rng: random.Random) -> float:
        """Full-jitter exponential backoff, never shorter than the server's Retry-After."""
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
        return max(rng.uniform(0, ceiling), retry_after_s or 0.0)


CALLER_HEADER = "X-Caller"  # whose call it is, for a meter shared by several pipelines


@dataclass(frozen=True)
class Try:
    """One HTTP attempt, as recorded in the attempts table."""

    attempt: int
    started: float
    ended: float
    outcome: str  # ok | http_429 | http_5xx | http_4xx | timeout | connection_error | bad_answer | not_sent
    http_status: int | None  # on a timeout or a broken connection: the answer had begun
    own: bool = False  # a failure of the request's own (see consumers.ai.circuit)
    usage: Usage = field(default_factory=Usage)
    tier: str = REALTIME  # the price tier the try was asked at (its attempt row's `tier`)


@dataclass(frozen=True)
class Flex:
    """A call's first try asked at the flex tier: the request `fields` that ask for it, and
    when the record falls back to realtime (epoch s)."""

    fields: Mapping[str, Any]
    until: float


BAD_ANSWER = "bad_answer"


class AIUnavailable(RuntimeError):
    """The request had its own tries while the endpoint served others, or an answer refused it
    for good (`final`): the request's fault."""

    def __init__(self, reason: str, final: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.final = final


class AIBadAnswer(RuntimeError):
    """A 2xx answer the stage cannot use (not JSON, or without the fields it keeps)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AIWaiting(RuntimeError):
    """The call could not be made or finished for reasons that are not the request's: the
    record waits and is tried again."""


class EndpointDown(AIWaiting):
    """The endpoint's circuit holds the try back: the record waits for it to admit calls."""


class CallObserver(Protocol):
    """Told before each try is sent and after it ends, so every try is on record even when
    the process dies in between; raising from `started` stops the try from being sent.

    `started` runs once the try holds its permit and budget, right before it is sent: a try
    counts as a call (one the provider may bill) from then, as the provider counts it, not while
    it waits for a permit, where a crash leaves nothing sent."""

    def started(self, attempt: int, at: float) -> None: ...

    def ended(self, attempt: Try) -> None: ...


class AIClient:
    """Calls one AI endpoint with retries; safe to share between threads.

    Calls go through urllib3's connection pool directly: `requests` on top of it costs CPU per
    call that the stage's other work and the broker beside it share on a small machine
    (docs/design.md#the-ai-client-calls-through-urllib3s-pool)."""

    def __init__(self, endpoint: Endpoint, policy: RetryPolicy | None = None,
                 pool_size: int = 64, seed: int | None = None, limiter: AdaptiveLimit | None = None,
                 circuit: Circuit | None = None, rate_budget: RateBudget | None = None,
                 timeout: LearnedTimeout | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = timeout or LearnedTimeout.fixed(endpoint.timeout_s)
        if self.timeout.ceiling_s > endpoint.timeout_s:
            raise ValueError(f"a learned timeout's ceiling {self.timeout.ceiling_s} s is over the "
                             f"endpoint's {endpoint.timeout_s} s")
        self.policy = policy or RetryPolicy()
        self.limiter = limiter
        self.rate_budget = rate_budget
        self.circuit = circuit
        self._admission = Admission(circuit, limiter, rate_budget)
        self._pool = urllib3.PoolManager(num_pools=1, maxsize=pool_size, retries=False)
        self._headers = {"Content-Type": "application/json", **endpoint.headers,
                         **({"Authorization": endpoint.auth_header} if endpoint.auth_header else {})}
        self._rng = random.Random(seed)

    def call(self, payload: dict[str, Any], observer: CallObserver | None = None, request: str = "",
             budget: int | None = None, flex: Flex | None = None) -> dict[str, Any]:
        """POST the payload for `request`; return the JSON answer, or raise (module docstring).
        `budget`: the request's own failures this call may still have (all of them: None);
        `flex`: try the flex tier first, until the record's fallback time."""
        budget = self.policy.max_attempts if budget is None else budget
        own, tries, reason = 0, 0, "no attempt made"
        first = 1  # the first realtime try's number: 2 after a flex try
        if flex is not None and flex.until > time.time():
            tried = self._flex(payload, flex, observer, request)
            if tried is not None and tried.outcome == OK:
                return tried.body
            if tried is not None:
                first, reason = 2, f"{tried.outcome} from the flex tier (try 1)"
        while tries < self.policy.max_attempts and own < budget:
            attempt = first + tries
            admitted = self._admitted(request, payload, attempt, observer, reason)
            reply, started, took, counted = self._try(payload, attempt, observer, admitted)
            tries, outcome = tries + 1, reply.outcome
            if observer is not None:
                observer.ended(Try(attempt, started, started + took, outcome, reply.status, own=counted,
                                   usage=Usage.of(reply.body, reply.headers)))
            if outcome == OK:
                return reply.body
            reason = f"{outcome} from {self.endpoint.url} (try {attempt})"
            if outcome == BAD_ANSWER:
                raise AIBadAnswer(f"2xx from {self.endpoint.url} whose body is not JSON")
            if outcome == "http_4xx":
                raise AIUnavailable(reason, final=True)
            own += counted
            if tries < self.policy.max_attempts and own < budget:
                time.sleep(self.policy.backoff(tries, reply.retry_after_s, self._rng))
        if own < budget:
            raise AIWaiting(f"{reason}: {tries} tries, not all of them failures of the request's own")
        if tries == 0 and first == 1:
            self._not_sent(1, observer)
        if self.circuit is None or self.circuit.serving():
            raise AIUnavailable(f"{reason}; the request's own failures reached max_attempts")
        raise AIWaiting(f"{reason}; the request had its tries, but the endpoint serves no one "
                        "else either: it waits for the endpoint")

    def _admitted(self, request: str, payload: dict[str, Any], attempt: int,
                  observer: CallObserver | None, reason: str, teaches: bool = True) -> Admitted:
        """The try let through the admission, or the call raised for waiting (module docstring)."""
        try:
            admitted = self._admission.admit(request, payload, teaches)
        except Cancelled:
            self._not_sent(attempt, observer)
            raise AIWaiting(f"the fleet is stopping: try {attempt} not sent; {reason}") from None
        if admitted is None:
            assert self.circuit is not None  # the one gate that holds a try back
            self._not_sent(attempt, observer)
            raise EndpointDown(f"{self.endpoint.url} is down for every caller (circuit "
                               f"{self.circuit.state}); {reason}")
        return admitted

    def _flex(self, payload: dict[str, Any], flex: Flex, observer: CallObserver | None,
              request: str) -> Reply | None:
        """The flex try's reply (try 1); None when its time ran out while it waited to be let
        through: it is not sent then, as a call its caller cannot wait for is billed all the same."""
        admitted = self._admitted(request, payload, 1, observer, "no attempt made", teaches=False)
        wait_s = min(flex.until - time.time(), self.timeout.ceiling_s)
        if wait_s <= 0:
            admitted.ended(Reply(None, {}, NOT_SENT), 0.0)
            return None
        reply, started, took, _ = self._try({**payload, **flex.fields}, 1, observer, admitted, wait_s)
        if observer is not None:
            observer.ended(Try(1, started, started + took, reply.outcome, reply.status,
                               usage=Usage.of(reply.body, reply.headers), tier=FLEX))
        if reply.outcome == BAD_ANSWER:
            raise AIBadAnswer(f"2xx from {self.endpoint.url} whose body is not JSON")
        return reply

    @staticmethod
    def _not_sent(attempt: int, observer: CallObserver | None) -> None:
        """End the first try's row, written before the call, when no try went out."""
        if attempt == 1 and observer is not None:
            now = time.time()
            observer.ended(Try(1, now, now, NOT_SENT, None))

    def _try(self, payload: dict[str, Any], attempt: int, observer: CallObserver | None,
             admitted: Admitted, flex_s: float | None = None) -> tuple[Reply, float, float, bool]:
        """One try `admitted` let through; its outcome, when it was sent (epoch s, for the
        record), how long it took (on the steady clock: the wall clock jumps, and a step mid-call
        would make a latency of an hour, or a negative one) and whether its failure is the
        request's own. It counts as a call at the endpoint from `sent`, once it is on record.
        A flex try is given `flex_s` and kept from the learned timeout."""
        reply, took = Reply(None, {}, NOT_SENT), 0.0
        try:
            if observer is not None:
                observer.started(attempt, time.time())
            admitted.sent()
            started, sent = time.time(), time.monotonic()
            if flex_s is not None:
                reply = self._post(payload, flex_s)
                took = time.monotonic() - sent
            else:
                ticket = self.timeout.sent(sent)
                try:
                    reply = self._post(payload, self.timeout.current())
                    took = time.monotonic() - sent
                finally:
                    self.timeout.ended(ticket, took if reply.outcome == OK else None)
        finally:
            own = admitted.ended(reply, took)
        return reply, started, took, own

    def _post(self, payload: dict[str, Any], timeout_s: float) -> Reply:
        """One POST within `timeout_s`, as a whole (see `_read_within`)."""
        deadline = time.monotonic() + timeout_s
        response = None
        try:
            response = self._pool.request("POST", self.endpoint.url, body=json.dumps(payload).encode(),
                                          headers=self._headers, preload_content=False,
                                          timeout=urllib3.Timeout(total=timeout_s))
            data = _read_within(response, deadline)
        except urllib3.exceptions.HTTPError as exc:
            return _cut_off(exc, response)
        status, headers = response.status, _headers_of(response)
        if status < 300:
            try:
                body = json.loads(data)
            except (UnicodeDecodeError, json.JSONDecodeError):
                return Reply(status, {}, BAD_ANSWER, headers=headers)
            return Reply(status, body, OK, headers=headers)
        if status == 429:
            return Reply(status, {}, OVERLOAD, header_number(headers.get("retry-after")),
                         refusal_kind(data, headers), headers)
        return Reply(status, {}, "http_5xx" if status >= 500 else "http_4xx")

    def stop_waiting(self) -> None:
        """The fleet stops: a try still waiting for a permit or a budget is not sent (its
        record is left to the partition's next owner), so the stop does not wait for them."""
        self._admission.stop()

    def close(self) -> None:
        self._pool.clear()


def _headers_of(response: urllib3.BaseHTTPResponse) -> dict[str, str]:
    return {k.lower(): v for k, v in response.headers.items()}


def _cut_off(exc: urllib3.exceptions.HTTPError, response: urllib3.BaseHTTPResponse | None) -> Reply:
    """A try that got no whole answer: sent and out of time (`timeout`: the provider may still
    answer it, and bill it), or not connected, reset or broken off (`connection_error`). When the
    answer had begun (`response`: its status line is in), the reply keeps its status and headers,
    so the cost figures can tell an answer the provider began from one it refused."""
    unsent = isinstance(exc, urllib3.exceptions.ConnectTimeoutError)  # NewConnectionError too, in urllib3 2
    timed_out = isinstance(exc, urllib3.exceptions.TimeoutError) and not unsent
    outcome = "timeout" if timed_out else "connection_error"
    if response is None:
        return Reply(None, {}, outcome)
    return Reply(response.status, {}, outcome, headers=_headers_of(response))


def _read_within(response: urllib3.BaseHTTPResponse, deadline: float) -> bytes:
    """The answer's body, read by `deadline` (time.monotonic) or not at all.

    urllib3's timeouts, `total` included, bound each socket read, not the answer: a body that
    drips in a byte at a time would keep the try going for as long as it drips, past the claim
    lease renewed before the try, and another member would call again. So each read gets what
    is left of the try's time; an answer not in by then ends as a timeout and its connection is
    closed rather than reused."""
    chunks: list[bytes] = []
    try:
        while True:
            remaining = deadline - time.monotonic()
            connection = response.connection
            if remaining <= 0:
                # Without a pool, as urllib3's own reads raise it: its hint asks for one.
                raise urllib3.exceptions.ReadTimeoutError(None, None, "answer not in within the timeout")  # type: ignore[arg-type]
            if isinstance(connection, HTTPConnection) and connection.sock is not None:
                connection.sock.settimeout(remaining)
            chunk = response.read1(64 * 1024)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    except BaseException:
        response.close()
        raise
    finally:
        response.release_conn()
