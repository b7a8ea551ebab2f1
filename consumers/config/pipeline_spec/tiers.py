"""The cheaper ways a provider sells an endpoint's answers, and the deadlines that allow them.

A record nobody waits on can be answered later for less: OpenAI's and Anthropic's batch
protocols at half the price, OpenAI's flex tier (`service_tier: flex`) at batch prices on the
ordinary call. An endpoint declares the tiers its provider sells, each with its price and the
turnaround it is expected within at first (`window_s`); a stage lists the tiers it may use and
the deadline its answers are due by, for every record or per record through an event field.

The checks here refuse what could never work, naming the field at fault: a tier the endpoint
does not sell, a batch protocol that does not carry the stage's requests, a fixed deadline
shorter than a tier's window (the tier could never meet it), a tier without a price or not
cheaper than realtime (it would never be chosen), a deadline field the events do not carry
as a number."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from consumers.config.pipeline_spec.base import Model, Scalar
from measure.cost import Prices

if TYPE_CHECKING:
    from consumers.config.pipeline_spec.endpoints import EndpointSpec
    from consumers.config.pipeline_spec.models import PipelineSpec

TierName = Literal["realtime", "flex", "batch"]
# A batch protocol and the work protocol whose requests its lines carry.
BATCH_CARRIES = {"openai_batch": "openai_chat", "anthropic_batch": "anthropic_messages"}


class Price(Model):
    """What a tier charges per 1,000 input and output tokens, from its provider's price list:
    the cost figures (`measure.cost`) price a call's tokens with it when no gateway reported the
    call's cost."""

    input_per_1k: Annotated[float, Field(ge=0)]
    output_per_1k: Annotated[float, Field(ge=0)]

    @property
    def prices(self) -> Prices:
        """The price as the cost figures and the tier router weigh it."""
        return Prices(self.input_per_1k, self.output_per_1k)


class FlexTier(Model):
    """The ordinary synchronous call asked for at a lower price by request `fields`; slower, and
    refused (429) when the provider is short of capacity."""

    fields: Annotated[dict[str, Scalar], Field(min_length=1)]
    price: Price | None = None
    window_s: PositiveFloat  # the turnaround expected until the tier's own calls tell better


class BatchTier(Model):
    """The provider's batch protocol: the requests uploaded as one file, a batch created and
    polled until it ends, each answer matched to its record by `custom_id`."""

    protocol: Literal["openai_batch", "anthropic_batch"]
    price: Price | None = None
    window_s: PositiveFloat  # the turnaround expected until the tier's own batches tell better
    max_requests: PositiveInt  # per batch (OpenAI 50,000; Anthropic 100,000)
    max_bytes: PositiveInt  # per batch's file (OpenAI 200 MB; Anthropic 256 MB)


class Tiers(Model):
    """The tiers an endpoint's provider sells besides realtime."""

    flex: FlexTier | None = None
    batch: BatchTier | None = None

    def of(self, name: str) -> FlexTier | BatchTier | None:
        return self.flex if name == "flex" else self.batch if name == "batch" else None


class Deadline(Model):
    """When a stage's answer to a record is due, in seconds after the request was produced:
    `within_s` for every record, or the event's own `field` (a number of seconds; records
    without it take `within_s`, or are realtime when there is none)."""

    within_s: PositiveFloat | None = None
    event_field: str | None = Field(None, alias="field")

    @model_validator(mode="after")
    def _one_source(self) -> Deadline:
        if self.within_s is None and self.event_field is None:
            raise ValueError("a deadline names within_s, a field of the events, or both")
        return self


def _cheaper(tier: Price, realtime: Price) -> bool:
    """Whether a tier's price is under realtime's for some call and over it for none."""
    return (tier.input_per_1k <= realtime.input_per_1k and tier.output_per_1k <= realtime.output_per_1k
            and (tier.input_per_1k, tier.output_per_1k) != (realtime.input_per_1k, realtime.output_per_1k))


def endpoint_tier_checks(name: str, endpoint: EndpointSpec) -> Iterable[tuple[str, str]]:
    """(field, problem) of one endpoint's tiers: each priced, and under realtime's price."""
    at = f"endpoints.{name}"
    for tier_name in ("flex", "batch"):
        tier = endpoint.tiers.of(tier_name)
        if tier is None:
            continue
        if endpoint.price is None:
            yield f"{at}.price", f"the {tier_name} tier is weighed against the realtime price: declare it"
        if tier.price is None:
            yield f"{at}.tiers.{tier_name}.price", "a tier is chosen by its price: declare it"
        elif endpoint.price is not None and not _cheaper(tier.price, endpoint.price):
            yield (f"{at}.tiers.{tier_name}.price", "not cheaper than the realtime price: the tier would "
                   "never be chosen")


def stage_tier_checks(spec: PipelineSpec) -> Iterable[tuple[str, str]]:
    """(field, problem) of each stage's tiers and deadline against its work and endpoint."""
    for name, stage in spec.stages.items():
        at = f"stages.{name}"
        later = [t for t in stage.tiers if t != "realtime"]
        if stage.deadline is not None:
            yield from _deadline_field_checks(at, stage.deadline, stage.event_schema)
        if not later:
            continue
        if stage.deadline is None:
            yield f"{at}.deadline", f"the {', '.join(later)} tier waits for its answer: say by when it is due"
        endpoint_name = getattr(stage.work, "endpoint", None)  # an HTTP work's
        if endpoint_name is None:
            yield f"{at}.tiers", "only a stage that calls an AI endpoint has tiers"
            continue
        endpoint = spec.endpoints.get(endpoint_name)
        if endpoint is None:
            continue  # refused as undeclared already
        for i, tier_name in enumerate(stage.tiers):
            tier = endpoint.tiers.of(tier_name)
            if tier_name == "realtime":
                continue
            if tier is None:
                sold = ["realtime", *(t for t in ("flex", "batch") if endpoint.tiers.of(t))]
                yield f"{at}.tiers.{i}", f"endpoint {endpoint_name!r} sells no {tier_name} tier, only {sold}"
                continue
            if isinstance(tier, BatchTier):
                carried = BATCH_CARRIES[tier.protocol]
                protocol = getattr(stage.work, "protocol", None)
                if protocol != carried:
                    yield (f"{at}.tiers.{i}", f"the endpoint's {tier.protocol} batches carry {carried} "
                           f"requests; this stage's work is {protocol}")
            if stage.deadline is not None and stage.deadline.within_s is not None \
                    and stage.deadline.within_s < tier.window_s:
                yield (f"{at}.deadline.within_s", f"{stage.deadline.within_s:g} s is shorter than the "
                       f"{tier_name} tier's window ({tier.window_s:g} s): the tier could never meet it")


def _deadline_field_checks(at: str, deadline: Deadline,
                           schema: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    if deadline.event_field is None:
        return
    found = schema.get("properties", {}).get(deadline.event_field)
    if found is None:
        yield f"{at}.deadline.field", f"the events have no field {deadline.event_field!r}"
    elif found.get("type") not in ("number", "integer"):
        yield f"{at}.deadline.field", f"{deadline.event_field!r} holds seconds: its schema's type is number"
