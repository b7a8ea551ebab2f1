"""An AI endpoint as a spec declares it: where it is, its limits, its prices, its latency and how
the stand-in serves it."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, PositiveInt

from consumers.config.pipeline_spec.base import Model, Name, Scalar
from consumers.config.pipeline_spec.tiers import Price, Tiers

Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile


class Latency(Model):
    """An endpoint's latency at real scale: fixed, or lognormal with a median and a p99."""

    distribution: Literal["fixed", "lognormal"] = "fixed"
    median_s: PositiveFloat
    p99_s: PositiveFloat | None = None
    # Generation time per output token, after the drawn time to the first token (chat answers).
    per_output_token_s: Annotated[float, Field(ge=0)] = 0.0

    @property
    def sigma(self) -> float:
        """The lognormal's shape: ln(p99 / median) / z(0.99)."""
        return math.log(self.p99_s / self.median_s) / Z99 if self.p99_s else 0.0

    @property
    def mean_s(self) -> float:
        """What a call costs on average (Little's law sizes the concurrency from it)."""
        return self.median_s * math.exp(self.sigma ** 2 / 2)


class Answer(Model):
    """One stand-in answer rule: the first whose `when` patterns all match the request is sent.
    Body strings may name request fields, e.g. `https://results.example/{request_id}.png`."""

    when: dict[str, str] = {}
    body: dict[str, Scalar]


class StandIn(Model):
    """How the project's stand-in service answers this endpoint (a real API ignores it)."""

    # plain: JSON in, the answer rule's body out; openai_chat: OpenAI's chat completions shape,
    # the rule body's `content` as the assistant's text.
    protocol: Literal["plain", "openai_chat"] = "plain"
    required: list[str] = []
    answers: Annotated[list[Answer], Field(min_length=1)]


class EndpointSpec(Model):
    """An AI endpoint: the Airflow connection that says where it is, its path and its limits."""

    connection: str
    path: Annotated[str, Field(pattern=r"^/[\w./-]*$")]
    # The model it serves, for an OpenAI-compatible API where every model shares one path:
    # a provider's limits are per model, so an endpoint is one model (its works' default model).
    model: str | None = None
    concurrency: PositiveInt
    # Per-minute budgets as providers meter them (None: not metered). `tokens` says which
    # tokens `tokens_per_minute` counts: the prompt's, the answer's, or both.
    requests_per_minute: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None
    tokens: Literal["input", "output", "total"] = "total"
    price: Price | None = None  # realtime's; None: the calls' cost is known only where a gateway reports it
    tiers: Tiers = Tiers()  # what its provider sells besides realtime, for records that can wait
    latency: Latency
    headers: dict[str, str] = {}  # sent with every call (never a key: that is the connection's)
    # How the project's stand-in serves it; an endpoint without one is a real API only.
    stand_in: StandIn | None = None
    # The provider quota it spends (`pipelines/quotas/<name>.yaml`), shared with every endpoint,
    # of any pipeline, that names it; its own limits above still hold within it.
    quota: Name | None = None
