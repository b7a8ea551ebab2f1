"""A provider quota declared once (`pipelines/quotas/<name>.yaml`) and spent by every endpoint,
of any pipeline, that names it (`EndpointSpec.quota`).

A provider meters an account, not an endpoint: one concurrency and one minute's requests and
tokens, whichever pipelines call it. The quota says how its pipelines share it: each pipeline
has a lane, the lanes served in strict priority (`LANES`, in that order) but for the share a
lane reserves, and a weight, which sets its fair share against the others of its lane. A
pipeline the quota does not list spends it all the same, with weight 1 in lane `standard`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, PositiveInt

from consumers.config.pipeline_spec.base import NAME, Model, Name
from consumers.config.pipeline_spec.models import HttpWork, PipelineSpec, SpecError
from consumers.config.pipeline_spec.validation import model_of

Lane = Literal["interactive", "standard", "batch"]
LANES: tuple[Lane, ...] = get_args(Lane)  # in priority order


class LaneSpec(Model):
    """A lane's reservation: the share of the quota the lanes before it cannot take from it."""

    reserve: Annotated[float, Field(gt=0, lt=1)]


class PipelineShare(Model):
    """A pipeline's lane on a quota, and its weight against the other pipelines of that lane."""

    weight: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    lane: Lane = "standard"


class QuotaSpec(Model):
    """A provider's quota: its limits (None: not metered) and how its pipelines share them.
    Build it with `parse_quota`, or `files.load_quota`."""

    name: Annotated[str, Field(pattern=NAME)]
    description: str = ""
    concurrency: PositiveInt | None = None  # calls at once across every endpoint that names it
    # Per-minute budgets, continuously refilled as providers meter them; `tokens` says which
    # tokens `tokens_per_minute` counts: the prompt's, the answer's, or both.
    requests_per_minute: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None
    tokens: Literal["input", "output", "total"] = "total"
    lanes: dict[Lane, LaneSpec] = Field(default_factory=dict)
    pipelines: dict[Name, PipelineShare] = Field(default_factory=dict)

    def share_of(self, pipeline: str) -> PipelineShare:
        """The pipeline's weight and lane: as listed, else weight 1 in lane `standard` (any
        pipeline whose endpoint names the quota spends it, listed or not)."""
        return self.pipelines.get(pipeline, PipelineShare())

    def summary(self) -> str:
        """For the check command: the limits, and each listed pipeline's weight and lane."""
        limits = [f"{field.replace('_', ' ')} {value}" for field in
                  ("concurrency", "requests_per_minute", "tokens_per_minute")
                  if (value := getattr(self, field)) is not None]
        lanes = [f"{lane} reserves {self.lanes[lane].reserve:g}" for lane in LANES if lane in self.lanes]
        shares = [f"{p} weight {s.weight:g} in {s.lane}" for p, s in self.pipelines.items()]
        return (f"{self.name}: {', '.join(limits)}"
                + (f" ({self.tokens} tokens)" if self.tokens_per_minute else "")
                + (f"; {', '.join(lanes)}" if lanes else "")
                + f"; pipelines {', '.join(shares) or 'none listed'} (any other: weight 1 in standard)")


def parse_quota(document: Any, source: str, specs: Collection[str]) -> QuotaSpec:
    """A validated quota from a decoded document, whose listed pipelines are among `specs` (the
    names of the specs found); raises SpecError naming each field at fault."""
    quota = model_of(QuotaSpec, document, source, "quota")
    problems = list(_checks(quota, specs))
    if problems:
        raise SpecError(source, problems, "quota")
    return quota


def _checks(quota: QuotaSpec, specs: Collection[str]) -> Iterable[tuple[str, str]]:
    if not (quota.concurrency or quota.requests_per_minute or quota.tokens_per_minute):
        yield "", "declare at least one of concurrency, requests_per_minute, tokens_per_minute"
    reserved = math.fsum(lane.reserve for lane in quota.lanes.values())
    if reserved > 1:
        yield "lanes", f"the reserves sum to {reserved:g}, more than the whole quota"
    found = ", ".join(sorted(specs)) or "none"
    for pipeline in quota.pipelines:
        if pipeline not in specs:
            yield f"pipelines.{pipeline}", f"no spec {pipeline!r} (found: {found})"


def spending_checks(spec: PipelineSpec, quotas: Mapping[str, QuotaSpec]) -> Iterable[tuple[str, str]]:
    """What a spec's endpoints ask of the quotas they name (`quotas`: those of them found):
    each quota must exist, and hold one call's tokens in a minute, or a call never fits.

    Not part of `parse`, which judges a spec alone: the quotas are files of their own, found
    where the spec is loaded from (`files.load` runs these checks). A quota whose concurrency
    is below an endpoint's own is fine: the lower one binds."""
    for name, endpoint in spec.endpoints.items():
        if endpoint.quota is not None and endpoint.quota not in quotas:
            yield (f"endpoints.{name}.quota",
                   f"quota {endpoint.quota!r} is not declared (no quotas/{endpoint.quota}.yaml)")
    for name, stage in spec.stages.items():
        work = stage.work
        if not isinstance(work, HttpWork) or work.endpoint not in spec.endpoints or not work.max_tokens:
            continue
        quota = quotas.get(spec.endpoints[work.endpoint].quota or "")
        # The answer's tokens count unless the quota meters the prompt's alone (unknown here).
        if quota and quota.tokens_per_minute and quota.tokens != "input" \
                and work.max_tokens > quota.tokens_per_minute:
            yield (f"stages.{name}.work.max_tokens",
                   f"a call may spend {work.max_tokens} tokens, more than quota {quota.name!r} "
                   f"meters in a minute ({quota.tokens_per_minute}): it would never be admitted")
