"""A pipeline declared as data: its topics, stages and AI endpoints (`endpoints.py`), as pydantic
models.

Every field is checked by its type (unknown fields are refused); what spans fields is checked by
`consumers.config.pipeline_spec.validation`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Annotated, Any, Literal

from jsonschema import Draft202012Validator
from pydantic import Field, PositiveFloat, PositiveInt

from consumers.config import http_work
from consumers.config.pipeline_spec.base import NAME, Model, Name, Scalar
from consumers.config.pipeline_spec.endpoints import EndpointSpec
from consumers.config.pipeline_spec.references import exception_class
from consumers.config.pipeline_spec.tiers import Deadline, TierName

DEAD_LETTER = "dlq"  # every pipeline's dead-letter topic: <prefix>.dlq
# Fields the runtime itself relies on in every event, beside the pipeline's key.
RUN_FIELDS = ("run_id", "produced_at")
TERMINAL_STATUSES = ("completed", "rejected")  # a route's status that settles a request
CALLABLE = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"


class SpecError(ValueError):
    """A spec (or a quota: `what`) the platform refuses; `problems` are (field path, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]], what: str = "pipeline spec") -> None:
        self.source = source
        self.problems = problems
        whole = f"({what.split()[-1]})"  # a problem of the document as a whole
        lines = "\n".join(f"  {path or whole}: {message}" for path, message in problems)
        super().__init__(f"{what} {source} refused:\n{lines}")


class TopicSpec(Model):
    """A topic (named <prefix>.<name> per run) and the event field its records are keyed by."""

    key: str


class ChatMessage(Model):
    role: Literal["system", "user", "assistant"]
    content: str  # a template (consumers.config.http_work)


# What an `openai_chat` work keeps unless it says otherwise: the answer's text and its usage.
CHAT_KEEP = {"content": "choices[0].message.content", "prompt_tokens": "usage.prompt_tokens",
             "completion_tokens": "usage.completion_tokens"}


class HttpWork(Model):
    """Call an AI endpoint: a request built from the event, answer fields kept by path.

    `protocol: json` (the default) sends `body`, a JSON template over the event
    (`consumers.config.http_work`), or `request`, a flat map of request field to event field.
    `protocol: openai_chat` sends an OpenAI-compatible chat completion from `model`,
    `messages` (templates), `max_tokens` and `temperature`, with `user` set to the request's key
    (what providers ask for to tell end users apart; a template may say otherwise), and keeps
    `CHAT_KEEP` unless `keep` names others. `keep` lists answer fields by name, or maps the
    names a result gets to their paths in the answer (`choices[0].message.content`)."""

    kind: Literal["http"]
    endpoint: str
    protocol: Literal["json", "openai_chat"] = "json"
    request: dict[str, str] = {}  # request field -> event field
    body: dict[str, Any] | None = None
    model: str | None = None
    messages: list[ChatMessage] = []
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    user: str | None = None
    keep: list[str] | dict[str, str] = []

    @property
    def kept(self) -> dict[str, str]:
        """Result field -> its path in the answer."""
        if isinstance(self.keep, dict):
            return dict(self.keep)
        if not self.keep and self.protocol == "openai_chat":
            return dict(CHAT_KEEP)
        return {name: name for name in self.keep}

    def payload(self, event: Mapping[str, Any], key: str, model: str | None = None) -> dict[str, Any]:
        """The request body for `event` (keyed by its field `key`); `model`: the endpoint's, for a
        chat work that names none."""
        if self.protocol == "openai_chat":
            chat = {"model": self.model or model, "messages": [m.model_dump() for m in self.messages],
                    "user": self.user or f"{{{{ event.{key} }}}}",
                    **({"max_tokens": self.max_tokens} if self.max_tokens else {}),
                    **({"temperature": self.temperature} if self.temperature is not None else {})}
            return http_work.render(chat, event)
        if self.body is not None:
            return http_work.render(self.body, event)
        return {name: event.get(source) for name, source in self.request.items()}

    def result(self, answer: Any) -> tuple[dict[str, Any], list[str]]:
        """The kept fields of an answer, and the paths it lacks."""
        picked = {name: http_work.pick(answer, path) for name, path in self.kept.items()}
        missing = [self.kept[name] for name, value in picked.items() if value is http_work.MISSING]
        return {name: value for name, value in picked.items() if value is not http_work.MISSING}, missing


class PythonWork(Model):
    """Custom work: `module:function(event) -> dict` of result fields; it must be idempotent.

    An exception it raises is the record's failure, tried again up to the stage's
    `retry.max_attempts` and then dead-lettered (`work_failed`), unless it is an instance of a
    class `transient` names (`module:Class`): a dependency of the work is down, and the record
    waits for it as for any failing dependency."""

    kind: Literal["python"]
    callable: Annotated[str, Field(pattern=CALLABLE)]
    transient: list[Annotated[str, Field(pattern=CALLABLE)]] = []

    @cached_property
    def transient_classes(self) -> tuple[type[BaseException], ...]:
        return tuple(exception_class(reference) for reference in self.transient)


Work = Annotated[HttpWork | PythonWork, Field(discriminator="kind")]


class Route(Model):
    """Where an outcome goes: to `to` when the `when` fields equal and the `unless` ones do not.

    The event sent is the input event with the kept result fields (`forward`) or a new one with
    the key, run id and `fields` (a value `$name` is the outcome's field `name`). `status` is
    what the request becomes; `once` sends only when this handling recorded the stage's result
    first, for messages a person should not get twice.
    """

    to: str
    when: dict[str, Scalar] = {}
    unless: dict[str, Scalar] = {}
    forward: bool = False
    fields: dict[str, Scalar] = {}
    status: str | None = None
    once: bool = False

    def matches(self, outcome: dict[str, Any]) -> bool:
        return (all(outcome.get(k) == v for k, v in self.when.items())
                and not (self.unless and all(outcome.get(k) == v for k, v in self.unless.items())))


class Retry(Model):
    max_attempts: Annotated[int, Field(ge=1, le=20)] = 4
    backoff_base_s: Annotated[float, Field(ge=0)] = 0.2


class StageSpec(Model):
    """One stage: the topic it reads, the events it accepts, its work and its routes."""

    source: str
    event_schema: dict[str, Any] = Field(alias="schema")
    record: list[str] = []  # event fields kept on the request row (joined across stages)
    join: list[str] = []  # wait until every one of these fields is on the request row
    status: str | None = None  # what the request becomes when this stage takes it
    work: Work | None = None
    routes: list[Route] = []
    retry: Retry = Retry()
    timeout_s: PositiveFloat = 10.0
    # The tiers of its endpoint it may call (`tiers.py`), and when its answers are due.
    tiers: Annotated[list[TierName], Field(min_length=1)] = ["realtime"]
    deadline: Deadline | None = None

    def free_text_field(self, key: str) -> str | None:
        """A plain string field of the events (no pattern, no enum; not the key or the run id):
        where bad-input tests and the oversize fault put their text."""
        return next((name for name, schema in self.event_schema.get("properties", {}).items()
                     if schema.get("type") == "string" and not {"pattern", "enum"} & set(schema)
                     and name not in (key, "run_id")), None)


class FailureNotice(Model):
    """What is sent when a request fails for good: its AI call or its work (it is also dead-lettered)."""

    to: str
    fields: dict[str, Scalar] = {}


class LoadSpec(Model):
    """The load source: `generator(rng, run_id, index, reject_share) -> [(topic, event), ...]`
    builds one request's events; `measure` is the topic whose partition spread is its skew."""

    generator: Annotated[str, Field(pattern=CALLABLE)]
    measure: str


class LatencyObjective(Model):
    """What a request's end-to-end latency (produced -> notified, at real scale) should stay
    within: a request completed within `latency_s` met the objective, and at least `share` of
    them should (a p99 within N seconds is `latency_s: N, share: 0.99`). Goodput counts the ones
    that met it per second (`measure.figures.objective_figures`)."""

    latency_s: PositiveFloat
    share: Annotated[float, Field(gt=0, le=1)] = 0.99


class PipelineSpec(Model):
    """A whole pipeline. Build it with `load` or `parse`, which also check across fields."""

    name: Annotated[str, Field(pattern=NAME)]
    description: str = ""
    key: str
    topics: Annotated[dict[Name, TopicSpec], Field(min_length=1)]
    endpoints: dict[Name, EndpointSpec] = {}
    stages: Annotated[dict[Name, StageSpec], Field(min_length=1)]
    failure_notice: FailureNotice | None = None
    load: LoadSpec
    objective: LatencyObjective | None = None

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(self.stages)

    @cached_property
    def ai_stages(self) -> tuple[str, ...]:
        """Stages that call an AI endpoint: the ones whose consumer mode is tuned."""
        return tuple(n for n, s in self.stages.items() if isinstance(s.work, HttpWork))

    @cached_property
    def entry_stages(self) -> tuple[str, ...]:
        """Stages fed by the load source rather than by another stage: a request is settled
        once each of them has taken it (they may arrive in any order)."""
        routed = {route.to for stage in self.stages.values() for route in stage.routes}
        return tuple(n for n, s in self.stages.items() if s.source not in routed)

    @property
    def completing_stage(self) -> str:
        """The stage whose results complete requests (its route settles them as completed):
        its completion times are the pipeline's throughput."""
        return next(n for n, s in self.stages.items() if any(r.status == "completed" for r in s.routes))

    def summary(self) -> str:
        """For logs and the check commands: the stages, where each endpoint is (and the quota it
        spends), and which ones the stand-in cannot serve (no `stand_in`: a run needs the real API)."""
        endpoints = [f"{name} on connection {e.connection}" + (f" (quota {e.quota})" if e.quota else "")
                     for name, e in self.endpoints.items()]
        real = sorted(name for name, e in self.endpoints.items() if e.stand_in is None)
        return (f"{self.name}: stages {', '.join(self.stages)}; endpoints {', '.join(endpoints) or 'none'}"
                + (f"\nnot served by the stand-in (real APIs only): {', '.join(real)}" if real else ""))

    @property
    def called_endpoints(self) -> tuple[str, ...]:
        """The endpoints some stage calls, in declaration order: the demand on the AI services.
        An endpoint no stage calls (a model's next version, for a candidate to switch to) is
        none, and sizes nothing."""
        called = {s.work.endpoint for s in self.stages.values() if isinstance(s.work, HttpWork)}
        return tuple(name for name in self.endpoints if name in called)

    def endpoint_of(self, stage: str) -> EndpointSpec | None:
        work = self.stages[stage].work
        return self.endpoints[work.endpoint] if isinstance(work, HttpWork) else None

    def declared_tail_s(self, stage: str) -> float:
        """How long a call of the stage's work takes at most, as its endpoint declares it (real
        scale, 0 for no call): the p99 (a fixed latency's value), and for a chat answer the
        generation of its `max_tokens`."""
        work, endpoint = self.stages[stage].work, self.endpoint_of(stage)
        if not isinstance(work, HttpWork) or endpoint is None:
            return 0.0
        latency = endpoint.latency
        return (latency.p99_s or latency.median_s) + latency.per_output_token_s * (work.max_tokens or 0)

    def outputs_of(self, stage: str) -> list[str]:
        """Topic names a stage writes besides the dead-letter topic."""
        spec = self.stages[stage]
        outputs = [r.to for r in spec.routes]
        if spec.work is not None and self.failure_notice:  # a request can fail for good there
            outputs.append(self.failure_notice.to)
        return sorted(set(outputs))

    def chain_around(self, endpoint: str) -> tuple[float, float]:
        """(before, after): the AI calls a request makes before its call on `endpoint` and after
        it, in mean seconds (real scale), read along the routes (the slowest branch where they
        fork); calls on `endpoint` itself are not counted. Where several
        stages call it, the shortest chain before any of them and after any of them: the
        endpoint's first call may come from any, and so may its last. (0, 0) for an endpoint no
        stage calls.

        text_moderation, moderate -> {summarize, classify} -> join: around summarize,
        (moderate's mean, 0); around moderate, (0, summarize's mean, the slower branch)."""
        if endpoint not in self.endpoints:
            raise KeyError(f"{self.name} has no endpoint {endpoint!r}")

        def own(stage: str) -> float:
            work = self.stages[stage].work
            return (self.endpoints[work.endpoint].latency.mean_s
                    if isinstance(work, HttpWork) and work.endpoint != endpoint else 0.0)

        def before(stage: str, seen: frozenset[str]) -> float:
            return max((before(n, seen | {n}) + own(n) for n in self.stages
                        if n not in seen and self._feeds(n, stage)), default=0.0)

        calling = [n for n, stage in self.stages.items()
                   if isinstance(stage.work, HttpWork) and stage.work.endpoint == endpoint]
        if not calling:
            return 0.0, 0.0
        return (min(before(n, frozenset({n})) for n in calling),
                min(self._after(n, own, frozenset({n})) for n in calling))

    def path_s(self, seconds: Mapping[str, float]) -> float:
        """A request's `seconds` per stage (its AI calls', say) along its path: summed where
        stages follow each other, the slowest branch where they fork, as the request waits.
        text_moderation with moderate 0.3, summarize 1.2 and classify 2.0 s: 2.3 s."""
        def own(stage: str) -> float:
            return seconds.get(stage, 0.0)

        return max((own(n) + self._after(n, own, frozenset({n})) for n in self.entry_stages), default=0.0)

    def _feeds(self, upstream: str, downstream: str) -> bool:
        return any(route.to == self.stages[downstream].source for route in self.stages[upstream].routes)

    def _after(self, stage: str, own: Callable[[str], float], seen: frozenset[str]) -> float:
        """The slowest chain of `own` seconds downstream of `stage`, along the routes."""
        return max((own(n) + self._after(n, own, seen | {n}) for n in self.stages
                    if n not in seen and self._feeds(stage, n)), default=0.0)

    def producing_topics(self) -> list[str]:
        """Topics the load source writes: the entry stages' sources."""
        return sorted({self.stages[s].source for s in self.entry_stages})

    @cached_property
    def validators(self) -> dict[str, Draft202012Validator]:
        return {name: Draft202012Validator(stage.event_schema) for name, stage in self.stages.items()}
