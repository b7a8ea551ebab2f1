"""A fleet is settled only when the group coordinator's description agrees with its members."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

from confluent_kafka import ConsumerGroupState, KafkaError, KafkaException, TopicPartition

from consumers.runtime.fleet import Fleet

GROUP = "p-check"


class Admin:
    """Answers describe_consumer_groups with one description, or fails as a loading coordinator does."""

    def __init__(self, state: ConsumerGroupState | None = None, members: dict[str, list[int]] | None = None,
                 ) -> None:
        self.state, self.members = state, members or {}

    def describe_consumer_groups(self, group_ids: list[str], request_timeout: float) -> dict[str, Future]:
        answer: Future = Future()
        if self.state is None:
            answer.set_exception(KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)))
        else:
            answer.set_result(SimpleNamespace(state=self.state, members=[
                SimpleNamespace(client_id=name, assignment=SimpleNamespace(
                    topic_partitions=[TopicPartition("p.style", n) for n in partitions]))
                for name, partitions in self.members.items()]))
        return {group_id: answer for group_id in group_ids}


def fleet(**assignments: set[int]) -> SimpleNamespace:
    """The parts of a Fleet that `_group_settled` reads: its group and its members' assignments."""
    return SimpleNamespace(
        settings=SimpleNamespace(member=SimpleNamespace(group_id=GROUP)),
        members=[SimpleNamespace(name=name, assignment={("p.style", n) for n in held})
                 for name, held in assignments.items()])


def settled(admin: Admin, **assignments: set[int]) -> bool:
    return Fleet._group_settled(fleet(**assignments), admin)


def test_settled_when_stable_and_each_member_holds_what_the_coordinator_gave_it() -> None:
    # check-2 holds nothing (more members than partitions); other-0 is another process's member.
    admin = Admin(ConsumerGroupState.STABLE, {"check-0": [0, 1], "check-1": [2], "check-2": [],
                                              "other-0": [3]})
    assert settled(admin, **{"check-0": {0, 1}, "check-1": {2}, "check-2": set()})


def test_not_settled_while_the_group_rebalances() -> None:
    admin = Admin(ConsumerGroupState.PREPARING_REBALANCING, {"check-0": [0, 1], "check-1": [2]})
    assert not settled(admin, **{"check-0": {0, 1}, "check-1": {2}})


def test_not_settled_when_the_coordinator_has_moved_a_partition_the_member_still_holds() -> None:
    admin = Admin(ConsumerGroupState.STABLE, {"check-0": [0], "check-1": [1, 2]})
    assert not settled(admin, **{"check-0": {0, 1}, "check-1": {2}})


def test_not_settled_when_a_member_is_not_in_the_description_yet() -> None:
    admin = Admin(ConsumerGroupState.STABLE, {"check-0": [0, 1, 2]})
    assert not settled(admin, **{"check-0": {0, 1}, "check-1": {2}})


def test_a_coordinator_that_cannot_describe_the_group_yet_means_not_settled() -> None:
    assert not settled(Admin(None), **{"check-0": {0, 1}})
