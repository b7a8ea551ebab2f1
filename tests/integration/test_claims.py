"""A stage's claim of its AI call against the real server: taken with the request in one
statement, with the first try's attempt row, and refused, handed over or answered with the
recorded result as the exactly-once path needs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from consumers.runtime.storage import CallClaim, Claim, ClaimLost, Ended, Key, Origin, Storage
from tests.integration.pipeline_fixtures import query
from tests.stack import Stack

STAGE = "check"
ORIGIN = Origin("check-0", "p.style", 3, 41)


@pytest.fixture
def storage(stack: Stack) -> Iterator[Storage]:
    pool = Storage(stack.database_url, pool_size=2)
    yield pool
    pool.close()


@pytest.fixture
def key() -> Key:
    return Key(f"claims-{uuid.uuid4().hex[:8]}", str(uuid.uuid4()), "claims-run")


def take(storage: Storage, key: Key, owner: str, fields: dict | None = None, lease_s: float = 30.0,
         join: tuple[str, ...] = ()) -> tuple[dict, Claim | None]:
    return storage.take(key, time.time(), fields or {}, None, CallClaim(STAGE, owner, lease_s, ORIGIN, join))


def attempts(stack: Stack, key: Key) -> list[tuple]:
    return query(stack.database_url, "SELECT attempt, outcome, member, kafka_offset, ended_at IS NULL "
                 "FROM ai_attempts WHERE pipeline = %s AND request_id = %s ORDER BY id",
                 key.pipeline, key.request_id)


def claim_row(stack: Stack, key: Key) -> list[tuple]:
    return query(stack.database_url, "SELECT owner, takeovers FROM stage_claims WHERE pipeline = %s "
                 "AND request_id = %s AND stage = %s", key.pipeline, key.request_id, STAGE)


def test_a_won_claim_comes_with_the_request_row_and_its_first_attempt_row(stack: Stack, storage: Storage,
                                                                          key: Key) -> None:
    row, claim = take(storage, key, "a", {"style": "dark"})
    assert row == {"style": "dark"}
    assert claim is not None and claim.done is None and claim.first_attempt is not None
    assert attempts(stack, key) == [(1, "queued", "check-0", 41, True)]  # no call yet
    assert claim_row(stack, key) == [("a", 0)]


def test_the_first_try_is_a_call_once_it_is_sent_and_a_later_try_gets_a_row(
        stack: Stack, storage: Storage, key: Key) -> None:
    _, claim = take(storage, key, "a", lease_s=0.5)
    assert claim is not None and claim.first_attempt is not None
    sent = storage.start_attempt(key, STAGE, ORIGIN, "a", 30.0, 1, time.time(), row=claim.first_attempt)
    assert sent == claim.first_attempt
    storage.start_attempt(key, STAGE, ORIGIN, "a", 30.0, 2, time.time())
    assert [a[:2] for a in attempts(stack, key)] == [(1, "started"), (2, "started")]
    # sending renewed the lease for 30 s: another member cannot take the claim over meanwhile
    time.sleep(0.6)
    _, other = take(storage, key, "b")
    assert other == Claim() and claim_row(stack, key) == [("a", 0)]


def test_a_try_is_not_sent_once_its_claim_was_taken_over(stack: Stack, storage: Storage, key: Key) -> None:
    _, claim = take(storage, key, "a", lease_s=0.0)
    assert claim is not None and claim.first_attempt is not None
    time.sleep(0.01)
    take(storage, key, "b")  # the lease expired while the try waited for its permit
    with pytest.raises(ClaimLost):
        storage.start_attempt(key, STAGE, ORIGIN, "a", 30.0, 1, time.time(), row=claim.first_attempt)
    assert [a[:2] for a in attempts(stack, key)] == [(1, "queued"), (1, "queued")]  # neither a call


def test_a_held_claim_is_refused_without_an_attempt_row_and_the_holder_may_claim_again(
        stack: Stack, storage: Storage, key: Key) -> None:
    take(storage, key, "a")
    row, claim = take(storage, key, "b", {"description": "second copy"})
    assert row == {"description": "second copy"}  # the take itself happened
    assert claim == Claim()
    _, again = take(storage, key, "a")  # the holder's retry of the record renews it
    assert again is not None and again.first_attempt is not None
    assert [a[:2] for a in attempts(stack, key)] == [(1, "queued"), (1, "queued")]
    assert claim_row(stack, key) == [("a", 0)]


def test_an_expired_lease_is_taken_over(stack: Stack, storage: Storage, key: Key) -> None:
    take(storage, key, "a", lease_s=0.0)
    time.sleep(0.01)
    _, claim = take(storage, key, "b")
    assert claim is not None and claim.first_attempt is not None
    assert claim_row(stack, key) == [("b", 1)]


def test_a_recorded_result_is_returned_and_the_skip_put_on_record(stack: Stack, storage: Storage,
                                                                 key: Key) -> None:
    _, claim = take(storage, key, "a")
    assert claim is not None and claim.first_attempt is not None
    ended = Ended(claim.first_attempt, time.time(), time.time(), "ok", 200, False)
    assert storage.record_result(key, STAGE, {"verdict": "approved"}, ORIGIN, None, False, [ended])
    _, again = take(storage, key, "b")
    assert again == Claim(done={"verdict": "approved"})
    assert [a[:2] for a in attempts(stack, key)] == [(1, "ok"), (0, "skipped_done")]
    assert claim_row(stack, key) == [("a", 0)]  # the claim was not touched


def test_no_claim_while_the_join_waits(stack: Stack, storage: Storage, key: Key) -> None:
    row, claim = take(storage, key, "a", {"user_id": "u1"}, join=("user_id", "style"))
    assert row == {"user_id": "u1"} and claim is None
    assert claim_row(stack, key) == [] and attempts(stack, key) == []
    row, claim = take(storage, key, "a", {"style": "dark"}, join=("user_id", "style"))
    assert row == {"user_id": "u1", "style": "dark"}
    assert claim is not None and claim.first_attempt is not None
    assert claim_row(stack, key) == [("a", 0)]
