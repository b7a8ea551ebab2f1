"""Partitions the active version's group lends to a canary's fleet, kept in PostgreSQL.

A canary splits a live topic by partitions: librdkafka has no pluggable assignor, and a group's
members get its partitions evenly, so a share such as 10 % cannot come from group membership.
The active version's members stay in their group and keep every partition it gives them; the
ones lent to the candidate they hold paused. The candidate's members `assign()` the lent
partitions under a group of their own and commit there. A hand-over is two steps, each made by
the side that lets go once it has drained and committed: the active owner writes where the
candidate starts (`lent`, at its group's commit), the candidate where the active version goes on
(`returned`, at its own group's commit). So no record is handled by both unless a side dies
mid-hand-over, and then only what it had in flight.

The candidate keeps its partitions by a lease it renews; when the lease lapses (the candidate's
fleet was killed) the active owner takes the partition back from the candidate group's last
commit, so a dead candidate holds nothing longer than the lease.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg2

LENDING, LENT, RETURNING, RETURNED = "lending", "lent", "returning", "returned"


@dataclass(frozen=True)
class Loan:
    """One lent partition as its row says."""

    partition: int
    canary_id: int
    state: str
    position: int | None
    holder: str | None
    # Nobody has it any more: held once and its holder's lease is over (the candidate died), or
    # asked back while nobody holds it. A lent partition not held yet does not lapse: a
    # candidate whose fleet starts later than one lease after the hand-over still gets it, and
    # the canary's step bounds the wait (its recall then returns it).
    lapsed: bool


_COLUMNS = ("partition, canary_id, state, position, holder, "
            "(state IN ('lent', 'returning') AND holder IS NOT NULL AND lease_until < now() "
            "OR state = 'returning' AND holder IS NULL) AS lapsed")


class LoanStore:
    """The loans' rows over one connection of its own, shared by a fleet's members (a loan's
    check must not wait behind the fleet's record writes)."""

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self._conn: psycopg2.extensions.connection | None = None
        self._lock = threading.Lock()

    def _run(self, sql: str, params: dict[str, object]) -> list[Loan]:
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg2.connect(self._url, connect_timeout=5,
                                              options="-c statement_timeout=5000")
            try:
                with self._conn, self._conn.cursor() as cur:
                    cur.execute(sql, params)
                    rows = cur.fetchall() if cur.description else []
            except psycopg2.Error:
                self._conn.close()
                raise
        return [Loan(*row) for row in rows]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()

    # ----------------------------------------------------------------- the canary's controller
    def lend(self, group_id: str, topic: str, partitions: Iterable[int], canary_id: int) -> None:
        """Ask the active group for `partitions` (already lent ones stay as they are)."""
        for partition in partitions:
            self._run("INSERT INTO partition_loans (group_id, topic, partition, canary_id, state) "
                      "VALUES (%(g)s, %(t)s, %(p)s, %(c)s, 'lending') ON CONFLICT DO NOTHING",
                      {"g": group_id, "t": topic, "p": partition, "c": canary_id})

    def recall(self, group_id: str, topic: str, canary_id: int) -> None:
        """Ask every partition of the canary back: a lent one is handed back by its holder, one
        not handed over yet is simply no longer asked for."""
        params = {"g": group_id, "t": topic, "c": canary_id}
        self._run("DELETE FROM partition_loans WHERE group_id = %(g)s AND topic = %(t)s "
                  "AND canary_id = %(c)s AND state = 'lending'", params)
        self._run("UPDATE partition_loans SET state = 'returning', updated_at = now() "
                  "WHERE group_id = %(g)s AND topic = %(t)s AND canary_id = %(c)s AND state = 'lent'",
                  params)

    def loans(self, group_id: str, topic: str) -> dict[int, Loan]:
        """Every partition of `topic` lent or asked for, by partition."""
        rows = self._run(f"SELECT {_COLUMNS} FROM partition_loans "
                         "WHERE group_id = %(g)s AND topic = %(t)s", {"g": group_id, "t": topic})
        return {loan.partition: loan for loan in rows}

    # ----------------------------------------------------------------- the active owner
    def handed_over(self, group_id: str, topic: str, partition: int, position: int, lease_s: float) -> None:
        """The active owner drained `partition` and committed `position`: the candidate starts
        there, and has `lease_s` to claim it."""
        self._run("UPDATE partition_loans SET state = 'lent', position = %(o)s, holder = NULL, "
                  "lease_until = now() + make_interval(secs => %(l)s), updated_at = now() "
                  "WHERE group_id = %(g)s AND topic = %(t)s AND partition = %(p)s AND state = 'lending'",
                  {"g": group_id, "t": topic, "p": partition, "o": position, "l": lease_s})

    def taken_back(self, group_id: str, topic: str, partition: int) -> None:
        self._run("DELETE FROM partition_loans WHERE group_id = %(g)s AND topic = %(t)s "
                  "AND partition = %(p)s", {"g": group_id, "t": topic, "p": partition})

    # ----------------------------------------------------------------- the candidate's members
    def hold(self, group_id: str, topic: str, canary_id: int, holder: str, borrowers: int,
             lease_s: float) -> dict[int, Loan]:
        """Renew `holder`'s lease on what it holds, claim unheld lent partitions up to its part
        (the canary's partitions over its `borrowers` members, rounded up), and return what it
        holds now. Claims skip rows another member is claiming at the same moment."""
        params = {"g": group_id, "t": topic, "c": canary_id, "h": holder, "n": max(1, borrowers),
                  "l": lease_s}
        self._run("UPDATE partition_loans SET lease_until = now() + make_interval(secs => %(l)s) "
                  "WHERE group_id = %(g)s AND topic = %(t)s AND holder = %(h)s "
                  "AND state IN ('lent', 'returning') AND lease_until >= now()", params)
        self._run("WITH free AS (SELECT partition FROM partition_loans WHERE group_id = %(g)s "
                  "AND topic = %(t)s AND canary_id = %(c)s AND state = 'lent' AND holder IS NULL "
                  "ORDER BY partition LIMIT GREATEST(0, "
                  "ceil((SELECT count(*) FROM partition_loans WHERE group_id = %(g)s AND topic = %(t)s "
                  "AND canary_id = %(c)s AND state IN ('lent', 'returning'))::float / %(n)s)::int "
                  "- (SELECT count(*) FROM partition_loans WHERE group_id = %(g)s AND topic = %(t)s "
                  "AND holder = %(h)s)) FOR UPDATE SKIP LOCKED) "
                  "UPDATE partition_loans l SET holder = %(h)s, "
                  "lease_until = now() + make_interval(secs => %(l)s), updated_at = now() "
                  "FROM free WHERE l.group_id = %(g)s AND l.topic = %(t)s AND l.partition = free.partition",
                  params)
        rows = self._run(f"SELECT {_COLUMNS} FROM partition_loans WHERE group_id = %(g)s "
                         "AND topic = %(t)s AND holder = %(h)s AND state IN ('lent', 'returning') "
                         "AND lease_until >= now()", params)
        return {loan.partition: loan for loan in rows}

    def returned(self, group_id: str, topic: str, partition: int, holder: str, position: int) -> None:
        """The candidate drained `partition` and committed `position`, asked to or stopping: the
        active owner goes on there."""
        self._run("UPDATE partition_loans SET state = 'returned', position = %(o)s, holder = NULL, "
                  "updated_at = now() WHERE group_id = %(g)s AND topic = %(t)s AND partition = %(p)s "
                  "AND holder = %(h)s AND state IN ('lent', 'returning')",
                  {"g": group_id, "t": topic, "p": partition, "h": holder, "o": position})
