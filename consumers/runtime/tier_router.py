"""Which tier a stage's record goes to: realtime now, or parked for the provider's batch tier
(`consumers.runtime.batch_keeper` sends the batches and brings the answers back).

A record has a deadline when its stage declares one (`StageSpec.deadline`: seconds after the
request was produced, fixed or from the event's field; both at real scale, so the time scale
applies, as to every duration the stand-in serves). The choice is `tier_choice.choose`'s: the
cheapest tier whose learned turnaround leaves time for a realtime call after it. What is kept
in hand for that call is the most one try may take now (the client's learned timeout) plus one
tick of the keeper, which notices the fallback time. The flex tier is not routed to yet: its
records are called realtime.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from consumers.ai.rate_budget import strings_of, tokens_of
from consumers.ai.tier_choice import REALTIME, Offer, Turnaround, choose, fallback_at
from consumers.config.pipeline_spec import EndpointSpec, StageSpec
from consumers.runtime.storage import Parked
from measure.cost import Prices

BATCH = "batch"


@dataclass
class TierRouter:
    """The routing of one stage's records; shared by the members of its fleet."""

    stage: StageSpec
    endpoint: EndpointSpec
    turnaround: Turnaround  # the batch tier's, learned by the keeper
    time_scale: float
    realtime_s: Callable[[], float]  # the time a fallback's realtime call is given

    @classmethod
    def of(cls, stage: StageSpec, endpoint: EndpointSpec, time_scale: float,
           realtime_s: Callable[[], float]) -> TierRouter | None:
        """The stage's router, None when it may only call realtime (or its endpoint sells no batches)."""
        batch = endpoint.tiers.batch
        if BATCH not in stage.tiers or batch is None or stage.deadline is None:
            return None
        return cls(stage, endpoint, Turnaround(batch.window_s * time_scale), time_scale, realtime_s)

    def deadline_at(self, event: Mapping[str, Any]) -> float | None:
        """When the stage's answer to the record is due (epoch s), None when it has no deadline."""
        deadline = self.stage.deadline
        assert deadline is not None  # a router is made only for a stage with one (`of`)
        within = event.get(deadline.event_field) if deadline.event_field else None
        if not isinstance(within, int | float) or isinstance(within, bool) or within <= 0:
            within = deadline.within_s
        return None if within is None else float(event["produced_at"]) + within * self.time_scale

    def parked(self, event: dict[str, Any], body: dict[str, Any], now: float) -> Parked | None:
        """The record's line when the batch tier is its cheapest fit, else None (realtime)."""
        due = self.deadline_at(event)
        if due is None:
            return None
        batch, realtime = self.endpoint.tiers.batch, self.endpoint.price
        assert batch is not None and batch.price is not None and realtime is not None  # spec checks
        offers = [Offer(REALTIME, Prices(realtime.input_per_1k, realtime.output_per_1k), 0.0),
                  Offer(BATCH, Prices(batch.price.input_per_1k, batch.price.output_per_1k),
                        self.turnaround.expected_s())]
        prompt = tokens_of("".join(strings_of(body.get("messages", body))))
        answer = body.get("max_tokens")
        reserve = self.realtime_s()
        tier = choose(offers, (prompt, answer if isinstance(answer, int) else prompt), due - now, reserve)
        return Parked(event, body, due, fallback_at(due, reserve)) if tier == BATCH else None
