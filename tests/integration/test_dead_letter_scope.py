"""A dead letter is unique per pipeline and run, not per topic offset alone: a topic recreated
under the same name (a new run with the same prefix) starts its offsets again, and its dead
letters must be recorded and settle their requests, while a record dead-lettered twice in one
run (consumed again after a crash) is still recorded once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from consumers.runtime.storage import Key, Origin, Storage
from tests.integration.pipeline_fixtures import query
from tests.stack import Stack

STAGE = "check"


@pytest.fixture
def storage(stack: Stack) -> Iterator[Storage]:
    pool = Storage(stack.database_url, pool_size=1)
    yield pool
    pool.close()


def dead_letter(storage: Storage, key: Key, origin: Origin) -> None:
    storage.record_dead_letter(key.pipeline, key.run_id, key, STAGE, "invalid_event: no style", origin,
                               b"{}", entry=True)


def test_a_recreated_topics_dead_letter_is_recorded_and_settles_its_request(stack: Stack,
                                                                            storage: Storage) -> None:
    pipeline, topic = f"scope-{uuid.uuid4().hex[:8]}", f"scope-{uuid.uuid4().hex[:8]}.style"
    first = Key(pipeline, str(uuid.uuid4()), f"{pipeline}-r1")
    second = Key(pipeline, str(uuid.uuid4()), f"{pipeline}-r2")
    origin = Origin("check-0", topic, 0, 7)  # the same offset of the same topic name, recreated
    dead_letter(storage, first, origin)
    dead_letter(storage, first, origin)  # consumed again in the same run: recorded once
    dead_letter(storage, second, origin)
    assert query(stack.database_url, "SELECT run_id, request_id FROM dead_letters WHERE pipeline = %s "
                 "ORDER BY id", pipeline) == [(first.run_id, first.request_id),
                                              (second.run_id, second.request_id)]
    assert query(stack.database_url, "SELECT request_id, status, entries FROM requests WHERE pipeline = %s "
                 "ORDER BY run_id", pipeline) == [(first.request_id, "dead_lettered", 1),
                                                  (second.request_id, "dead_lettered", 1)]


def test_the_same_offset_in_another_pipelines_run_is_its_own_dead_letter(stack: Stack,
                                                                         storage: Storage) -> None:
    run, topic = f"scope-{uuid.uuid4().hex[:8]}", f"scope-{uuid.uuid4().hex[:8]}.style"
    keys = [Key(f"{run}-{name}", str(uuid.uuid4()), run) for name in ("a", "b")]
    for key in keys:
        dead_letter(storage, key, Origin("check-0", topic, 2, 0))
    assert query(stack.database_url, "SELECT pipeline FROM dead_letters WHERE run_id = %s ORDER BY id",
                 run) == [(k.pipeline,) for k in keys]
