"""Provisioning is idempotent, grows but never shrinks, and refuses impossible requests."""

from __future__ import annotations

import pytest

from consumers.kafka_clients.provisioning import ProvisioningError, provision
from tests.stack import Stack, unique


def test_provision_twice_then_grow_then_refuse_shrink(stack: Stack) -> None:
    topic = unique("prov")
    rf = min(3, stack.brokers)
    first = provision(stack.connection, [topic], 4, "durability", rf)
    again = provision(stack.connection, [topic], 4, "durability", rf)
    grown = provision(stack.connection, [topic], 6, "durability", rf)
    shrink = provision(stack.connection, [topic], 2, "durability", rf)
    assert [r.action for r in (*first, *again, *grown, *shrink)] == ["created", "unchanged", "grown",
                                                                     "unchanged"]
    assert (again[0].warnings, grown[0].partitions, shrink[0].partitions) == ([], 6, 6)
    assert "keys now hash to other partitions" in grown[0].warnings[0]
    assert "never shrunk" in shrink[0].warnings[0]
    assert shrink[0].replication_factor == rf


@pytest.mark.parametrize(("partitions", "rf", "message"), [
    (4, 5, "replication factor 5 exceeds the"),
    (0, 1, "partitions must be at least 1"),
    (4, 0, "replication factor must be at least 1"),
])
def test_impossible_requests_are_refused_before_any_change(stack: Stack, partitions: int, rf: int,
                                                           message: str) -> None:

    topic = unique("refused")
    with pytest.raises(ProvisioningError, match=message):
        provision(stack.connection, [topic], partitions, "durability", rf)
    assert topic not in stack.connection.admin().list_topics(timeout=10).topics
