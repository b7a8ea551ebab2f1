"""Run N members of one stage's consumer group as threads of one process (its command line:
`consumers/runtime/fleet_args.py`). Consumer threads spend their time in librdkafka and HTTP calls,
which release the GIL, so threads are enough for dozens of members."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaException

from consumers.ai.batch_api import BatchAPI
from consumers.ai.circuit import Circuit
from consumers.ai.client import CALLER_HEADER, AIClient, Endpoint
from consumers.ai.learned_timeout import LearnedTimeout
from consumers.ai.limit import AdaptiveLimit
from consumers.ai.limit.log import ChangeLog
from consumers.ai.rate_budget import RateBudget
from consumers.ai.tier_choice import BATCH
from consumers.canary.loans import LoanStore
from consumers.config import events, kafka_connection, pipeline_spec
from consumers.config.candidate import KEYS_ENV, WINDOW_MODES, Endpoints
from consumers.kafka_clients.producer import KeyedProducer
from consumers.quota.holder import LEASE_S, QuotaHolder
from consumers.quota.leases import Holder, LeaseStore, Limits
from consumers.runtime import fleet_args, metrics, start_up_heap, storage
from consumers.runtime.batch_keeper import LEASE_S as BATCH_LEASE_S
from consumers.runtime.batch_keeper import TICK_S as BATCH_TICK_S
from consumers.runtime.batch_keeper import BatchKeeper, KeeperSettings
from consumers.runtime.batch_member import BatchMember
from consumers.runtime.borrower_member import BorrowerMember
from consumers.runtime.fleet_settings import (
    FleetSettings,
    MissingEndpoint,
    check_endpoint,
    member_name,
    settings_for,
)
from consumers.runtime.flow_member import FlowMember
from consumers.runtime.member import StageMember
from consumers.runtime.outbox import DirectOutbox
from consumers.runtime.share_member import ShareMember
from consumers.runtime.stages import StageContext
from consumers.runtime.storage.batches import BatchStore, Scope
from consumers.runtime.tier_router import TierRouter
from consumers.runtime.window_pool import WindowPool

log = logging.getLogger(__name__)

# The member that runs each consumer mode (profiles.CONSUMER_MODES).
MEMBER_KINDS: dict[str, type[StageMember]] = {"baseline": BatchMember, "bounded": BatchMember,
                                              "flow": FlowMember, "share": ShareMember}

CIRCUIT_STATES = {"closed": 0, "half_open": 1, "open": 2}  # the gauge's values

CHANGES_RECORD_INTERVAL_S = 1.0  # how often an adaptive limit's and a circuit's changes are written
# A record's transactions take far longer on a saturated machine than on an idle one, and an AI
# stage's workers come back from their calls in waves, so a smaller pool kept them waiting for a
# connection (docs/design.md#a-fleet-holds-48-database-connections).
DB_CONNECTIONS = 48


def epoch_of(steady_s: float) -> float:
    """The epoch seconds, for the record, of a reading of time.monotonic (an adaptive limit's
    changes are stamped on the steady clock its deadlines run on)."""
    return time.time() - (time.monotonic() - steady_s)


class MembersStuck(RuntimeError):
    """Members still running after the shutdown deadline."""


class Fleet:
    """The members of one stage, sharing a producer, a database pool and an HTTP client."""

    def __init__(self, settings: FleetSettings) -> None:
        self.settings = settings
        s = settings
        spec = pipeline_spec.load(s.pipeline, s.work_changes)
        check_endpoint(spec, s)  # before anything connects or joins
        concurrency = s.member.window * s.members if s.member.mode in WINDOW_MODES else s.members
        self.storage = storage.sized_pool(s.database_url, min(DB_CONNECTIONS, concurrency + 2))
        self.quota: QuotaHolder | None = None  # set by `_client` when the endpoint spends a quota
        self.limit_log = ChangeLog()  # an adaptive limit's moves, written down by `_record_changes`
        self.producer = KeyedProducer(s.member.kafka, profile=s.member.profile, key_strategy=s.key_strategy,
                                      batch_records=s.member.producer_batch_records)
        self.ctx = StageContext(
            stage=s.member.stage, topics=events.Topics(s.prefix, spec),
            storage=self.storage, outbox=DirectOutbox(self.producer, self.storage.mark_notified),
            key_strategy=s.key_strategy, ai=self._client(s.ai_url, concurrency, spec),
            claim_lease_s=s.claim_lease_s,
            windows=WindowPool(concurrency) if s.member.mode == "flow" else None,
            loans=LoanStore(s.database_url) if s.member.mode == "flow" else None,
        )
        self.keeper = self._later_tiers(spec)
        self.members = self._members()
        self.storage.record_members(s.member.run_id, s.member.stage, s.version, s.canary,
                                    [m.name for m in self.members])
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._recorder: threading.Thread | None = None
        self._quota_stop = threading.Event()  # set once the members' calls are over
        self._renewer: threading.Thread | None = None
        self._keeper_stop = threading.Event()  # set once the members are stopped
        self._keeper_thread: threading.Thread | None = None

    def _members(self) -> list[StageMember]:
        """The stage's members: in its group, or, for a canary, on what the group lends it."""
        s = self.settings
        names = [member_name(s.member.stage, i, s.instance) for i in range(s.members)]
        if s.canary is not None:
            if s.member.mode != "flow":
                raise ValueError(f"a canary's fleet runs in flow mode; {s.member.stage} is in "
                                 f"{s.member.mode!r} mode")
            return [BorrowerMember(name, s.member, self.ctx, s.canary, s.members) for name in names]
        return [MEMBER_KINDS[s.member.mode](name, s.member, self.ctx) for name in names]

    def _client(self, url: str | None, pool: int, spec: pipeline_spec.PipelineSpec) -> AIClient | None:
        """The stage's AI client: told the endpoint's concurrency and per-minute budgets (a
        minute shortened by the time scale), or, adaptive, told nothing and left to learn them
        from the endpoint's refusals and rate-limit headers."""
        if not url:
            return None
        s = self.settings
        declared = spec.endpoints[s.ai_endpoint]
        limiter = (AdaptiveLimit(maximum=pool, watchers=(self.limit_log,)) if s.adaptive
                   else AdaptiveLimit.fixed(s.ai_calls) if s.ai_calls
                   else AdaptiveLimit.fixed(pool) if declared.quota else None)
        budget = (RateBudget() if s.adaptive
                  else RateBudget(declared.requests_per_minute, declared.tokens_per_minute,
                                  minute_s=60.0 * s.member.time_scale))
        # Every call says whose it is (a provider's project header plays that part): the
        # stand-in counts an account's spending per caller by it.
        headers = {**declared.headers, CALLER_HEADER: spec.name}
        endpoint = Endpoint(url, s.ai_timeout_s, s.ai_auth_header, headers)
        timeout = LearnedTimeout(s.ai_timeout_floor_s or s.ai_timeout_s, s.ai_timeout_s)
        if declared.quota and limiter is not None:
            self.quota = self._quota_holder(spec, declared.quota, pool, limiter, budget)
        return AIClient(endpoint, s.retry, pool_size=pool, limiter=limiter, circuit=Circuit(),
                        rate_budget=budget, timeout=timeout)

    def _later_tiers(self, spec: pipeline_spec.PipelineSpec) -> BatchKeeper | None:
        """The stage's router to its later tiers (`ctx.router`), when it may use one, and the
        keeper of its batches when the batch tier is among them; None otherwise."""
        s, ai = self.settings, self.ctx.ai
        stage = spec.stages[s.member.stage]
        if ai is None or s.ai_url is None or not isinstance(stage.work, pipeline_spec.HttpWork):
            return None
        endpoint = spec.endpoints[stage.work.endpoint]
        # a fallback is given the most one try may take, and the keeper's tick that notices it
        router = TierRouter.of(stage, endpoint, s.member.time_scale,
                               lambda: ai.timeout.current() + BATCH_TICK_S)
        self.ctx.router = router
        if router is None or BATCH not in router.turnarounds or endpoint.tiers.batch is None:
            return None
        owner = f"{s.member.stage}/{s.instance or 'fleet'}/{socket.gethostname()}/{os.getpid()}"
        return BatchKeeper(
            KeeperSettings(endpoint.tiers.batch, endpoint.path, self.ctx.topics.source_of(s.member.stage),
                           s.member.time_scale),
            BatchStore(s.database_url, Scope(spec.name, s.member.run_id, s.member.stage), owner,
                       BATCH_LEASE_S),
            BatchAPI.beside(s.ai_url, endpoint.path, s.ai_auth_header, endpoint.headers),
            self.producer, router.turnarounds[BATCH])

    def _quota_holder(self, spec: pipeline_spec.PipelineSpec, name: str, pool: int,
                      limiter: AdaptiveLimit, budget: RateBudget) -> QuotaHolder:
        """This fleet's hold on the provider quota its endpoint spends: a claim of its own,
        told from the stage's other processes by host and process id. Its grant counts for as
        long after its lease as one try may take."""
        s = self.settings
        quota = pipeline_spec.load_quota(name)
        share = quota.share_of(spec.name)
        who = Holder(quota.name, f"{s.member.run_id}/{s.member.stage}/{socket.gethostname()}/{os.getpid()}",
                     spec.name, s.member.stage, s.member.run_id, share.lane, share.weight,
                     lease_s=LEASE_S, drain_s=s.ai_timeout_s)
        declared = Limits(quota.concurrency, quota.requests_per_minute, quota.tokens_per_minute)
        return QuotaHolder(LeaseStore(s.database_url), who, declared, pool, limiter, budget,
                           reserves={lane: spec_.reserve for lane, spec_ in quota.lanes.items()},
                           minute_s=60.0 * s.member.time_scale)

    def start(self) -> Fleet:
        if self.quota is not None:  # the first grant before the first call
            self.quota.tick()
            self._renewer = threading.Thread(target=self.quota.run, args=(self._quota_stop,),
                                             name=f"{self.settings.member.stage}-quota", daemon=True)
            self._renewer.start()
        for member in self.members:
            thread = threading.Thread(target=member.run, args=(self._stop,), name=member.name)
            thread.start()
            self._threads.append(thread)
        if self.keeper is not None:
            self._keeper_thread = threading.Thread(target=self.keeper.run, args=(self._keeper_stop,),
                                                   name=f"{self.settings.member.stage}-batches", daemon=True)
            self._keeper_thread.start()
        if self.ctx.ai is not None:
            self._recorder = threading.Thread(target=self._record_changes, args=(self.ctx.ai,),
                                              name=f"{self.settings.member.stage}-changes", daemon=True)
            self._recorder.start()
        return self

    def _record_changes(self, ai: AIClient) -> None:
        """Write the circuit's changes (and an adaptive limit's and rate budget's) every second
        until the fleet stops, then the last ones; show the circuit's state as a metric."""
        s = self.settings
        stage, endpoint = s.member.stage, s.ai_endpoint
        circuit = ai.circuit
        assert circuit is not None  # the fleet's client always has one (`_client`)
        writes: list[tuple[deque[Any], Callable[[list[Any]], None]]] = [(
            circuit.changes,
            lambda changes: self.storage.record_circuit(s.member.run_id, stage, endpoint, changes))]
        if s.adaptive:
            writes.append((self.limit_log.entries, lambda changes: self.storage.record_limits(
                s.member.run_id, stage, [(epoch_of(at), limit, n) for at, limit, n in changes])))
        if s.adaptive and ai.rate_budget is not None:
            writes.append((ai.rate_budget.changes, lambda changes: self.storage.record_budgets(
                s.member.run_id, stage, [(epoch_of(at), *change) for at, *change in changes])))
        stopping = False
        while not stopping:
            stopping = self._stop.wait(CHANGES_RECORD_INTERVAL_S)
            metrics.CIRCUIT.labels(stage=stage, endpoint=endpoint).set(CIRCUIT_STATES[circuit.state])
            for pending, write in writes:
                changes = [pending.popleft() for _ in range(len(pending))]
                if not changes:
                    continue
                try:
                    write(changes)
                except Exception as exc:  # noqa: BLE001 - a record of what happened, never a reason to stop
                    log.warning("changes not recorded: %s", exc)
                    pending.extendleft(reversed(changes))

    def wait_assigned(self, timeout_s: float | None = None) -> None:
        """Block until every member that can get partitions has them and the group is settled."""
        timeout_s = timeout_s or self.settings.assignment_timeout_s
        deadline = time.monotonic() + timeout_s
        while not all(m.assigned_once.is_set() for m in self.members):
            self.raise_failures()
            if time.monotonic() > deadline:
                waiting = [m.name for m in self.members if not m.assigned_once.is_set()]
                raise TimeoutError(f"{waiting} got no assignment within {timeout_s}s")
            time.sleep(0.05)
        settled_since = time.monotonic()
        last = self._assignments()
        admin = None if self.settings.member.mode == "share" else self.settings.member.kafka.admin()

        def settled() -> bool:
            return time.monotonic() - settled_since >= 1.0 and (admin is None or self._group_settled(admin))

        while not settled():
            if time.monotonic() > deadline:
                raise TimeoutError("group assignment did not settle")
            time.sleep(0.1)
            now = self._assignments()
            if now != last:
                last, settled_since = now, time.monotonic()

    def _group_settled(self, admin: Any) -> bool:
        """The coordinator's view agrees: the group is stable and gives each member of this fleet
        that holds partitions what it holds. A member's own assignment can stay the same for a
        second while the group's next rebalance is under way: a steady load started then met
        members that stopped fetching for it (its first records waited, and commits were refused
        with ILLEGAL_GENERATION). A group the coordinator cannot describe yet (it is
        loading, or moving with a broker's restart) is not settled: asked again until the deadline."""
        group_id = self.settings.member.group_id
        try:
            group = admin.describe_consumer_groups([group_id], request_timeout=10)[group_id].result()
        except KafkaException as exc:
            log.info("group %s not described yet: %s", group_id, exc)
            return False
        if group.state != ConsumerGroupState.STABLE:
            return False
        held = {m.client_id: {(tp.topic, tp.partition) for tp in m.assignment.topic_partitions}
                for m in group.members}
        return all(held.get(m.name) == m.assignment for m in self.members if m.assignment)

    def raise_failures(self) -> None:
        """Re-raise the first member failure, so a broken fleet fails fast and loudly."""
        for member in self.members:
            if member.failure is not None:
                raise RuntimeError(f"member {member.name} failed: {member.failure!r}") from member.failure
        if self.keeper is not None and self.keeper.failure is not None:
            raise RuntimeError(f"the batch keeper failed: {self.keeper.failure!r}") from self.keeper.failure

    def _assignments(self) -> list[frozenset]:
        return [frozenset(m.assignment) for m in self.members]

    def request_stop(self) -> None:
        """Tell the members to stop without waiting for them (`stop` waits): fleets told
        together stop together. Tries still waiting at the AI client's gates are not sent."""
        self._stop.set()
        if self.ctx.ai is not None:
            self.ctx.ai.stop_waiting()

    def stop(self) -> None:
        """Graceful stop: members finish in-flight work, commit and leave the group."""
        self.request_stop()
        deadline = time.monotonic() + self.settings.shutdown_deadline_s + 10
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if self._recorder is not None:
            self._recorder.join(5)
        if self._keeper_thread is not None:  # its last resends go out before the producer closes
            self._keeper_stop.set()
            self._keeper_thread.join(30)
        if self.quota is not None and self._renewer is not None:
            self._quota_stop.set()
            self._renewer.join(5)
            if not alive:  # no call out any more: the share goes back now, not at the lease's end
                self.quota.release()
        self.producer.close()
        if self.ctx.ai is not None:
            self.ctx.ai.close()
        if self.ctx.loans is not None:
            self.ctx.loans.close()
        self.storage.close()
        if alive:
            raise MembersStuck(f"members still running after the shutdown deadline: {alive}")

    @contextmanager
    def running(self) -> Iterator[Fleet]:
        """`with fleet.running():` starts the members and always stops them; `wait_assigned`
        waits for their partitions, so several fleets can join their groups at once."""
        self.start()
        try:
            yield self
        finally:
            self.stop()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    p = fleet_args.parser()
    args = p.parse_args()
    kafka = kafka_connection.from_args(args, p)
    if not args.database_url:
        p.error("set --database-url or DATABASE_URL (or source .local/stack.env)")
    token = os.environ.get(args.ai_token_env) if args.ai_token_env else None
    endpoints = Endpoints(json.loads(args.ai_endpoints), f"Bearer {token}" if token else None,
                          json.loads(os.environ.get(KEYS_ENV, "{}")))
    try:
        config = fleet_args.config_from_args(args)
    except ValueError as exc:  # a --stage the pipeline does not have, a refused spec
        p.error(str(exc))
    metrics.serve(args.metrics_port, args.metrics_host)
    topics = events.Topics(args.prefix or args.run_id, config.spec)
    settings = settings_for(config, args.stage, args.run_id, topics, kafka, args.database_url, endpoints)
    try:
        instance = args.instance or (f"canary{args.canary}" if args.canary is not None else None)
        fleet = Fleet(replace(settings, instance=instance, version=args.version, canary=args.canary))
    except MissingEndpoint as exc:
        p.error(str(exc))
    start_up_heap.freeze()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    fleet.start()
    log.info("fleet %s running: %s", args.stage, config.stage(args.stage))
    # Watch the members while waiting: a process whose member loop died must not run on with
    # fewer members; it exits non-zero (EX_SOFTWARE) so its supervisor starts it again.
    failure: RuntimeError | None = None
    while failure is None and not stop.wait(0.5):
        try:
            fleet.raise_failures()
        except RuntimeError as exc:
            failure = exc
    if failure is not None:
        log.critical("fleet %s: %s; stopping the other members, then exiting %d", args.stage,
                     failure, os.EX_SOFTWARE, exc_info=failure)
    log.info("stopping: finishing in-flight work")
    stop_or_exit(fleet, args.stage)
    if failure is not None:
        raise SystemExit(os.EX_SOFTWARE)


def stop_or_exit(fleet: Fleet, stage: str) -> None:
    """Stop the fleet; a member blocked in a client call past the deadline cannot be joined and
    its thread would keep the process up, doing nothing, forever: the process exits at once
    (EX_SOFTWARE), so its supervisor starts it again."""
    try:
        fleet.stop()
    except MembersStuck as exc:
        log.critical("fleet %s: %s; exiting %d now", stage, exc, os.EX_SOFTWARE)
        logging.shutdown()
        os._exit(os.EX_SOFTWARE)


if __name__ == "__main__":
    main()
