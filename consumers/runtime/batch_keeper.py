"""The batch tier's keeper: one thread of each fleet process whose stage parks records for the
provider's batches (`consumers.runtime.tier_router`). It holds no consumer and no AI slot: the
parked records' offsets are committed, their lines wait in PostgreSQL, and each tick it

1. renews the leases of the batches it works on, taking over those of a keeper that died;
2. assembles the oldest pending lines into a batch (full, or its oldest line `gather_s` old);
3. uploads an assembling batch's file and creates the provider's batch; a batch taken over
   after its file went up is first looked for among the provider's batches, so a create whose
   answer was lost is not made twice;
4. polls its submitted batches; an ended one's answers settle their lines, its errors and
   what it left unanswered fall back;
5. falls back every line whose fallback time came (`tier_choice.fallback_at`), and cancels a
   batch none of whose lines waits for it any more;
6. sends each settled line's event to the stage's source topic again: the stage takes the
   answer from the line, or calls realtime for a line that fell back.

A failing dependency (the database, the provider's batch endpoints, Kafka) is waited out: the
tick logs it and the next tick tries again; nothing is lost meanwhile, since every step's state
is in the rows. A line's fallback time keeps a realtime call's time and one tick in hand.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from consumers.ai.batch_api import ENDED, BatchAPI, BatchCallFailed
from consumers.ai.tier_choice import SAMPLES, Turnaround
from consumers.config.pipeline_spec.tiers import BatchTier
from consumers.kafka_clients.producer import KeyedProducer
from consumers.runtime import failures
from consumers.runtime.storage.batches import ASSEMBLING, SUBMITTED, BatchStore, OpenBatch

log = logging.getLogger(__name__)
T = TypeVar("T")

TICK_S = 1.0  # how often the keeper moves its batches on (wall seconds)
LEASE_S = 15.0  # how long a batch stays a keeper's without its renewal: a dead keeper's is taken over then
GATHER_S = 5.0  # a batch waits this long for more lines (real scale: the time scale applies)
RESEND_LINES = 500  # settled lines sent back to the stage per tick
DELIVERY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class KeeperSettings:
    """What one keeper works on: the tier's limits, the source topic its events go back to."""

    tier: BatchTier
    work_path: str  # the endpoint's path, which each line's request is for
    source_topic: str
    time_scale: float = 1.0

    @property
    def gather_s(self) -> float:
        return GATHER_S * self.time_scale


class BatchKeeper:
    """Moves one stage's batch lines on, tick by tick (module docstring)."""

    def __init__(self, settings: KeeperSettings, store: BatchStore, api: BatchAPI,
                 producer: KeyedProducer, turnaround: Turnaround) -> None:
        self.settings, self.store, self.api, self.producer = settings, store, api, producer
        self.turnaround = turnaround
        self.failure: BaseException | None = None  # what stopped it: the fleet goes down with it
        self._unsure: set[int] = set()  # batches whose create got no answer: look before creating again

    def run(self, stop: threading.Event) -> None:
        """Tick until `stop` is set, then hand the batches back for another keeper; a failure
        no tick can judge ends the thread with `failure` set."""
        try:
            while not stop.wait(TICK_S):
                self.tick()
        except BaseException as exc:
            self.failure = exc
            raise
        finally:
            try:
                self.store.release()
            except Exception as exc:  # noqa: BLE001 - the leases then run out on their own
                log.warning("batch leases not released: %s", exc)
            self.store.close()
            self.api.close()

    def tick(self) -> None:
        """One round of the six steps, each on its own: a step that a failing dependency stops
        (a batch the provider will not create, say) keeps none of the others from their work,
        and is tried again at the next tick."""
        self._step(lambda: self.turnaround.learned(self.store.turnarounds(SAMPLES)))
        self._step(self._assemble)
        held = self._step(self.store.hold) or []
        for batch in held:
            if batch.state == ASSEMBLING:
                self._step(functools.partial(self._submit, batch.id, batch.input_file_id, batch.taken_over))
            elif batch.state == SUBMITTED and batch.provider_id:
                self._step(functools.partial(self._poll, batch.id, batch.provider_id))
        for batch_id in self._step(self.store.fall_back_due) or []:
            self._step(functools.partial(self._cancel, batch_id, held))
        self._step(self._resend)

    def _step(self, step: Callable[[], T]) -> T | None:
        """The step's result; None when a dependency failed it (logged), and anything else raises."""
        try:
            return step()
        except BatchCallFailed as exc:
            log.warning("batch tier of %s: %s; trying again in %.0f s", self.store.scope.stage, exc, TICK_S)
        except Exception as exc:
            if failures.classify(exc).kind != failures.TRANSIENT:
                raise
            log.warning("batch tier of %s waits for a dependency: %s", self.store.scope.stage, exc)
        return None

    def _assemble(self) -> None:
        tier = self.settings.tier
        while self.store.assemble(tier.max_requests, tier.max_bytes, self.settings.gather_s) is not None:
            pass

    def _submit(self, batch_id: int, input_file_id: str | None, taken_over: bool) -> None:
        """Upload the batch's file and create the provider's batch of it; a batch all of whose
        lines fell back while its create was refused ends without one."""
        waiting = self.store.lines_of(batch_id)
        if not waiting:
            self.store.ended(batch_id, "abandoned")
            return
        if input_file_id is None:
            lines = [{"custom_id": request_id, "method": "POST", "url": self.settings.work_path, "body": body}
                     for request_id, body in waiting]
            input_file_id = self.api.upload(lines)
            self.store.uploaded(batch_id, input_file_id)
        elif taken_over or batch_id in self._unsure:
            found = self.api.created_from(input_file_id)
            if found is not None:
                self.store.submitted(batch_id, str(found["id"]))
                self._unsure.discard(batch_id)
                return
        try:
            created = self.api.create(input_file_id, self.settings.work_path)
        except BatchCallFailed as exc:
            if exc.status is None:
                self._unsure.add(batch_id)
            elif exc.refused and exc.status != 429:  # a queue limit's 429 is waited out
                log.warning("batch %d refused, its lines fall back: %s", batch_id, exc)
                self.store.ended(batch_id, "refused", left=f"batch refused: {exc}"[:500])
                return
            raise
        self.store.submitted(batch_id, str(created["id"]))
        self._unsure.discard(batch_id)

    def _poll(self, batch_id: int, provider_id: str) -> None:
        found = self.api.retrieve(provider_id)
        status = str(found.get("status"))
        if status not in ENDED:
            return
        answers = {}
        failed = {}
        for line in self.api.lines(found.get("output_file_id")) + self.api.lines(found.get("error_file_id")):
            request_id = str(line.get("custom_id"))
            response = line.get("response") or {}
            if line.get("error") is None and 200 <= int(response.get("status_code") or 0) < 300:
                answers[request_id] = response.get("body")
            else:
                error = line.get("error") or {}
                failed[request_id] = f"batch line error: {error.get('code') or response.get('status_code')}"
        answered, late = self.store.ended(batch_id, status, answers, failed)
        log.info("batch %d (%s) %s: %d answered, %d too late, %d failed", batch_id, provider_id, status,
                 answered, late, len(failed))

    def _cancel(self, batch_id: int, held: list[OpenBatch]) -> None:
        """A batch whose lines have all fallen back: cancelled, so what it has not run is not
        billed; it is polled on until it ends, and what it did answer is counted as paid."""
        provider_id = next((b.provider_id for b in held if b.id == batch_id), None)
        if provider_id is not None:
            self.api.cancel(provider_id)

    def _resend(self) -> None:
        with self.store.resending(RESEND_LINES) as lines:
            sent = [self.producer.send(self.settings.source_topic, line.event) for line in lines]
            for delivery in sent:
                delivery.result(DELIVERY_TIMEOUT_S)
