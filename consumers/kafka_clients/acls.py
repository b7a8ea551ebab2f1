"""Least privilege on a secured cluster: what each role's principal may do with a run's topics.

The load source may write the topics requests enter by; each stage of the run's pipeline may read
its source topic as its own consumer group and write its routes' topics and the dead-letter
topic, and, when its outputs are exactly once, use its members' transactional ids; nothing else.
Topics are per run, so the admin grants these when it provisions a run's topics, with LITERAL
patterns (a prefixed pattern cannot say "the `.style` topic of any run"), and takes them back
when it deletes them. Two are granted by PREFIXED pattern, since what they name is not known
when the run's topics are provisioned: the members' transactional ids, the group's name and a
dot (a member's id is its group's and its own name, `consumers.config.profiles.transactional_id`),
and the groups the stage's canaries commit under (`consumers.config.events.canary_group`). An open cluster
has no principals to grant to, and nothing is done.

CreateAcls returns once the controller has committed the bindings, but each broker authorizes
from its own copy of the cluster metadata, which catches up a moment later. A fleet that reached
a lagging broker first would be refused, and an idempotent producer refused its producer id is
unusable for good; so `grant` returns only when every broker lets every role see its topics.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from consumers.config.events import Topics
from consumers.config.kafka_connection import KafkaAccess
from consumers.config.profiles import transactional_id


class Grant(NamedTuple):
    """One operation on one resource, its name matched literally or as a prefix."""

    kind: ResourceType
    name: str
    operation: AclOperation
    pattern: ResourcePatternType = ResourcePatternType.LITERAL


def grants(topics: Topics, role: str) -> list[Grant]:
    """The resources and operations one role needs for a run (READ and WRITE imply DESCRIBE)."""
    if role == "source":
        return [Grant(ResourceType.TOPIC, t, AclOperation.WRITE) for t in topics.producing()]
    if role not in topics.spec.stages:
        raise ValueError(f"unknown role {role!r}; roles: source, {', '.join(topics.spec.stages)}")
    # ALTER_CONFIGS on its own group: a share-group member sets its group's offset reset and
    # record lock before it subscribes (consumers/runtime/share_member.py).
    prefixed = ResourcePatternType.PREFIXED
    return [Grant(ResourceType.TOPIC, topics.source_of(role), AclOperation.READ),
            Grant(ResourceType.GROUP, topics.group_of(role), AclOperation.READ),
            Grant(ResourceType.GROUP, topics.group_of(role), AclOperation.ALTER_CONFIGS),
            Grant(ResourceType.GROUP, topics.canary_groups_of(role), AclOperation.READ, prefixed),
            Grant(ResourceType.TRANSACTIONAL_ID, transactional_id(topics.group_of(role), ""),
                  AclOperation.WRITE, prefixed),
            *(Grant(ResourceType.TOPIC, t, AclOperation.WRITE) for t in topics.outputs_of(role))]


def grantees(topics: Topics, access: KafkaAccess) -> dict[str, str]:
    """role -> principal, for the run's roles (the source and its pipeline's stages) that run
    as a principal of their own."""
    return {role: principal for role, principal in access.grantees().items()
            if role == "source" or role in topics.spec.stages}


def bindings(topics: Topics, access: KafkaAccess) -> list[AclBinding]:
    """ALLOW bindings for every role of the run that runs as a principal of its own."""
    return [AclBinding(g.kind, g.name, g.pattern, principal, "*", g.operation, AclPermissionType.ALLOW)
            for role, principal in grantees(topics, access).items() for g in grants(topics, role)]


def grant(admin: AdminClient, topics: Topics, access: KafkaAccess, timeout_s: float = 30.0) -> int:
    """Create the run's bindings (idempotent) and wait until every broker applies them; return
    how many."""
    wanted = bindings(topics, access)
    if wanted:
        for future in admin.create_acls(wanted, request_timeout=timeout_s).values():
            future.result()
        brokers = [f"{b.host}:{b.port}" for b in admin.list_topics(timeout=timeout_s).brokers.values()]
        _wait_applied(topics, access, brokers, time.monotonic() + timeout_s)
    return len(wanted)


def _wait_applied(topics: Topics, access: KafkaAccess, brokers: list[str], deadline: float) -> None:
    """Until each broker shows each role its topics. A new client's first request goes to its
    only bootstrap broker, so one client per broker and role asks exactly that broker."""
    for role in grantees(topics, access):
        names = [g.name for g in grants(topics, role) if g.kind == ResourceType.TOPIC]
        for broker in brokers:
            settings = access.of(role).client(**{"bootstrap.servers": broker})
            while True:
                found = AdminClient(settings).list_topics(timeout=10).topics  # the ones it may see
                missing = [n for n in names if n not in found or found[n].error is not None]
                if not missing:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"broker {broker} does not yet let {role} see {missing}")
                time.sleep(0.1)


def revoke(admin: AdminClient, topics: Topics, access: KafkaAccess, timeout_s: float = 30.0) -> int:
    """Delete every binding on the run's topics and groups; return how many were deleted."""
    if not grantees(topics, access):
        return 0
    resources = {(g.kind, g.name, g.pattern) for role in grantees(topics, access)
                 for g in grants(topics, role)}
    # None: any principal and host, as AclBindingFilter's documentation says; its hints are AclBinding's.
    filters = [AclBindingFilter(kind, name, matched, None, None,  # type: ignore[arg-type]
                                AclOperation.ANY, AclPermissionType.ANY) for kind, name, matched in resources]
    return sum(len(future.result())
               for future in admin.delete_acls(filters, request_timeout=timeout_s).values())
