"""A fleet's database pool against the real server: its free connections are counted right,
so a pool shrinks to the room left instead of failing its fleet.

The stack's other clients (Airflow's components) may open or close a connection between two
counts, so each check gets three tries and one exact count must come out of them."""

from __future__ import annotations

from collections.abc import Callable

import psycopg2
import pytest

from consumers.runtime.storage import LEFT_FOR_OTHERS, Storage, free_connections, sized_pool
from tests.stack import Stack

# Counts the server's free connections and takes nearly all of them: another worker's tests
# would change the counts and be refused connections.
pytestmark = pytest.mark.serial


def opened_by(stack: Stack, open_pool: Callable[[int], Storage]) -> list[tuple[int, int]]:
    """(free before, connections the server counts the pool as holding), three times."""
    seen = []
    for _ in range(3):
        free = free_connections(stack.database_url)
        pool = open_pool(free)
        try:
            seen.append((free, free - free_connections(stack.database_url)))
        finally:
            pool.close()
    return seen


def test_free_connections_fall_by_the_connections_a_pool_opens(stack: Stack) -> None:
    with psycopg2.connect(stack.database_url) as conn, conn.cursor() as cur:
        cur.execute("SHOW max_connections")
        maximum = int(cur.fetchone()[0])
    conn.close()
    seen = opened_by(stack, lambda free: Storage(stack.database_url, pool_size=5))
    assert all(0 < free < maximum for free, _ in seen)  # the stack's clients hold some
    assert any(opened == 5 for _, opened in seen), seen


def test_a_pool_asked_for_more_than_is_free_gets_the_room_left(stack: Stack) -> None:
    seen = opened_by(stack, lambda free: sized_pool(stack.database_url, free + 50))
    assert any(opened == free - LEFT_FOR_OTHERS for free, opened in seen), seen
