"""Which tier a stage's record goes to: realtime now, the flex tier's cheaper synchronous call
(falling back to realtime by itself, `consumers.ai.client.Flex`), or parked for the provider's
batch tier (`consumers.runtime.batch_keeper` sends the batches and brings the answers back).

A record has a deadline when its stage declares one (`StageSpec.deadline`: seconds after the
request was produced, fixed or from the event's field; both at real scale, so the time scale
applies, as to every duration the stand-in serves). The choice is `tier_choice.choose`'s: the
cheapest tier whose learned turnaround leaves time for a realtime call after it. What is kept
in hand for that call is the most one try may take now (the client's learned timeout) plus one
tick of the keeper, which notices a batch line's fallback time. Of two tiers at one price the
batch is taken: its record holds no place in the stage's window meanwhile, and its calls come
out of the provider's batch pool rather than the realtime quota.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from consumers.ai.rate_budget import strings_of, tokens_of
from consumers.ai.tier_choice import BATCH, FLEX, REALTIME, Offer, Turnaround, choose, fallback_at
from consumers.config.pipeline_spec import EndpointSpec, StageSpec


@dataclass(frozen=True)
class Choice:
    """A record's tier, when it is due and when it is called realtime instead (epoch s)."""

    tier: str
    deadline_at: float
    fallback_at: float


@dataclass
class TierRouter:
    """The routing of one stage's records; shared by the members of its fleet."""

    stage: StageSpec
    endpoint: EndpointSpec
    time_scale: float
    realtime_s: Callable[[], float]  # the time a fallback's realtime call is given
    turnarounds: dict[str, Turnaround] = field(default_factory=dict)  # each later tier's, learned

    @classmethod
    def of(cls, stage: StageSpec, endpoint: EndpointSpec, time_scale: float,
           realtime_s: Callable[[], float]) -> TierRouter | None:
        """The stage's router, None when it may only call realtime (no deadline, or no later
        tier that both the stage lists and its endpoint sells)."""
        if stage.deadline is None:
            return None
        sold = {name: tier for name in (BATCH, FLEX) if name in stage.tiers
                and (tier := endpoint.tiers.of(name)) is not None}
        if not sold:
            return None
        return cls(stage, endpoint, time_scale, realtime_s,
                   {name: Turnaround(tier.window_s * time_scale) for name, tier in sold.items()})

    def deadline_at(self, event: Mapping[str, Any]) -> float | None:
        """When the stage's answer to the record is due (epoch s), None when it has no deadline."""
        deadline = self.stage.deadline
        assert deadline is not None  # a router is made only for a stage with one (`of`)
        within = event.get(deadline.event_field) if deadline.event_field else None
        if not isinstance(within, int | float) or isinstance(within, bool) or within <= 0:
            within = deadline.within_s
        return None if within is None else float(event["produced_at"]) + within * self.time_scale

    def choose(self, event: Mapping[str, Any], body: Mapping[str, Any], now: float) -> Choice | None:
        """The record's tier (None: it has no deadline, and is called realtime)."""
        due = self.deadline_at(event)
        if due is None:
            return None
        assert self.endpoint.price is not None  # spec checks: a later tier is weighed against it
        offers = [Offer(REALTIME, self.endpoint.price.prices, 0.0)]
        for name, turnaround in self.turnarounds.items():  # batch first: it wins a tie
            sold = self.endpoint.tiers.of(name)
            assert sold is not None and sold.price is not None  # spec checks
            offers.append(Offer(name, sold.price.prices, turnaround.expected_s()))
        prompt = tokens_of("".join(strings_of(body.get("messages", body))))
        answer = body.get("max_tokens")
        reserve = self.realtime_s()
        tier = choose(offers, (prompt, answer if isinstance(answer, int) else prompt), due - now, reserve)
        return Choice(tier, due, fallback_at(due, reserve))

    def flex_answered(self, seconds: float) -> None:
        """A flex try answered in `seconds`: the flex tier's turnaround learns it."""
        if FLEX in self.turnarounds:
            self.turnarounds[FLEX].add(seconds)
