"""A pipeline declared as data: its topics, AI endpoints and stages, read from `pipelines/*.yaml`.

The runtime (`consumers.stages`), provisioning, the ACLs, the load source and the AI stand-in
read everything pipeline-specific from a `PipelineSpec`, so a team brings its own workload by
writing a spec, not by changing the platform. A spec is validated whole before anything is
provisioned: pydantic checks every field (unknown fields are refused) and `PipelineSpec` checks
what spans fields (a route to an undeclared topic, a work naming an undeclared endpoint). Every
mistake comes back as `SpecError` with the path of the field at fault, e.g.
`stages.check.routes.1.to: ...`.

    python -m consumers.pipeline_spec check pipelines/genai_image.yaml
    python -m consumers.pipeline_spec list
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

from consumers import http_work

PIPELINES_DIR = Path(__file__).resolve().parent.parent / "pipelines"
REFERENCE = "genai_image"
DEAD_LETTER = "dlq"  # every pipeline's dead-letter topic: <prefix>.dlq
# Fields the runtime itself relies on in every event, beside the pipeline's key.
RUN_FIELDS = ("run_id", "produced_at")
TERMINAL_STATUSES = ("completed", "rejected")  # a route's status that settles a request
NAME = r"^[a-z][a-z0-9_]{0,39}$"
CALLABLE = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile

Name = Annotated[str, Field(pattern=NAME)]
Scalar = str | int | float | bool


class SpecError(ValueError):
    """A spec the platform refuses; `problems` are (field path, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {path or '(spec)'}: {message}" for path, message in problems)
        super().__init__(f"pipeline spec {source} refused:\n{lines}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Latency(_Model):
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


class Answer(_Model):
    """One stand-in answer rule: the first whose `when` patterns all match the request is sent.
    Body strings may name request fields, e.g. `https://results.example/{request_id}.png`."""

    when: dict[str, str] = {}
    body: dict[str, Scalar]


class StandIn(_Model):
    """How the project's stand-in service answers this endpoint (a real API ignores it)."""

    # plain: JSON in, the answer rule's body out; openai_chat: OpenAI's chat completions shape,
    # the rule body's `content` as the assistant's text.
    protocol: Literal["plain", "openai_chat"] = "plain"
    required: list[str] = []
    answers: Annotated[list[Answer], Field(min_length=1)]


class Price(_Model):
    """What an endpoint charges per 1,000 input and output tokens, from its provider's price
    list: the cost figures (`measure.cost`) price a call's tokens with it when no gateway
    reported the call's cost."""

    input_per_1k: Annotated[float, Field(ge=0)]
    output_per_1k: Annotated[float, Field(ge=0)]


class EndpointSpec(_Model):
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
    price: Price | None = None  # None: the calls' cost is known only where a gateway reports it
    latency: Latency
    headers: dict[str, str] = {}  # sent with every call (never a key: that is the connection's)
    # How the project's stand-in serves it; an endpoint without one is a real API only.
    stand_in: StandIn | None = None


class TopicSpec(_Model):
    """A topic (named <prefix>.<name> per run) and the event field its records are keyed by."""

    key: str


class ChatMessage(_Model):
    role: Literal["system", "user", "assistant"]
    content: str  # a template (consumers.http_work)


# What an `openai_chat` work keeps unless it says otherwise: the answer's text and its usage.
CHAT_KEEP = {"content": "choices[0].message.content", "prompt_tokens": "usage.prompt_tokens",
             "completion_tokens": "usage.completion_tokens"}


class HttpWork(_Model):
    """Call an AI endpoint: a request built from the event, answer fields kept by path.

    `protocol: json` (the default) sends `body`, a JSON template over the event
    (`consumers.http_work`), or `request`, a flat map of request field to event field.
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


class PythonWork(_Model):
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


class Route(_Model):
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


class Retry(_Model):
    max_attempts: Annotated[int, Field(ge=1, le=20)] = 4
    backoff_base_s: Annotated[float, Field(ge=0)] = 0.2


class StageSpec(_Model):
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

    def free_text_field(self, key: str) -> str | None:
        """A plain string field of the events (no pattern, no enum; not the key or the run id):
        where bad-input tests and the oversize fault put their text."""
        return next((name for name, schema in self.event_schema.get("properties", {}).items()
                     if schema.get("type") == "string" and not {"pattern", "enum"} & set(schema)
                     and name not in (key, "run_id")), None)


class FailureNotice(_Model):
    """What is sent when a request fails for good: its AI call or its work (it is also dead-lettered)."""

    to: str
    fields: dict[str, Scalar] = {}


class LoadSpec(_Model):
    """The load source: `generator(rng, run_id, index, reject_share) -> [(topic, event), ...]`
    builds one request's events; `measure` is the topic whose partition spread is its skew."""

    generator: Annotated[str, Field(pattern=CALLABLE)]
    measure: str


class PipelineSpec(_Model):
    """A whole pipeline. Build it with `load` or `parse`, which also check across fields."""

    name: Annotated[str, Field(pattern=NAME)]
    description: str = ""
    key: str
    topics: Annotated[dict[Name, TopicSpec], Field(min_length=1)]
    endpoints: dict[Name, EndpointSpec] = {}
    stages: Annotated[dict[Name, StageSpec], Field(min_length=1)]
    failure_notice: FailureNotice | None = None
    load: LoadSpec

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
        """For logs and the check commands: the stages, where each endpoint is, and which ones
        the stand-in cannot serve (no `stand_in`: a run needs the real API)."""
        endpoints = [f"{name} on connection {e.connection}" for name, e in self.endpoints.items()]
        real = sorted(name for name, e in self.endpoints.items() if e.stand_in is None)
        return (f"{self.name}: stages {', '.join(self.stages)}; endpoints {', '.join(endpoints) or 'none'}"
                + (f"\nnot served by the stand-in (real APIs only): {', '.join(real)}" if real else ""))

    def endpoint_of(self, stage: str) -> EndpointSpec | None:
        work = self.stages[stage].work
        return self.endpoints[work.endpoint] if isinstance(work, HttpWork) else None

    def outputs_of(self, stage: str) -> list[str]:
        """Topic names a stage writes besides the dead-letter topic."""
        spec = self.stages[stage]
        outputs = [r.to for r in spec.routes]
        if spec.work is not None and self.failure_notice:  # a request can fail for good there
            outputs.append(self.failure_notice.to)
        return sorted(set(outputs))

    @cached_property
    def ai_path_s(self) -> float:
        """The longest chain of AI calls one request makes, in mean seconds (real scale): the
        endpoints' latencies summed along the routes, the slowest branch where they fork."""
        def longest(stage: str, seen: frozenset[str]) -> float:
            spec = self.stages[stage]
            work = spec.work
            own = self.endpoints[work.endpoint].latency.mean_s if isinstance(work, HttpWork) else 0.0
            after = [longest(n, seen | {n}) for route in spec.routes for n, s in self.stages.items()
                     if s.source == route.to and n not in seen]
            return own + max(after, default=0.0)

        return max(longest(stage, frozenset({stage})) for stage in self.entry_stages)

    def producing_topics(self) -> list[str]:
        """Topics the load source writes: the entry stages' sources."""
        return sorted({self.stages[s].source for s in self.entry_stages})

    @cached_property
    def validators(self) -> dict[str, Draft202012Validator]:
        return {name: Draft202012Validator(stage.event_schema) for name, stage in self.stages.items()}


def _cross_checks(spec: PipelineSpec) -> Iterable[tuple[str, str]]:
    """What one field's type cannot say: references between fields, and the schemas."""
    declared = sorted(spec.topics)
    if DEAD_LETTER in spec.topics:
        yield f"topics.{DEAD_LETTER}", "is the dead-letter topic every pipeline gets: pick another name"
    for name, topic in spec.topics.items():
        if not topic.key:
            yield f"topics.{name}.key", "must name the event field records are keyed by"
    for name, stage in spec.stages.items():
        at = f"stages.{name}"
        if stage.source not in spec.topics:
            yield f"{at}.source", f"topic {stage.source!r} is not declared (declared: {declared})"
        try:
            Draft202012Validator.check_schema(stage.event_schema)
        except SchemaError as exc:
            path = ".".join(str(p) for p in exc.path)
            yield f"{at}.schema{'.' + path if path else ''}", f"not a valid JSON Schema: {exc.message}"
        else:
            required = set(stage.event_schema.get("required", []))
            for needed in (spec.key, *RUN_FIELDS):
                if needed not in required:
                    yield f"{at}.schema.required", f"must require {needed!r} (the runtime reads it)"
        if isinstance(stage.work, HttpWork):
            if stage.work.endpoint not in spec.endpoints:
                yield (f"{at}.work.endpoint", f"endpoint {stage.work.endpoint!r} is not declared "
                       f"(declared: {sorted(spec.endpoints)})")
            endpoint = spec.endpoints.get(stage.work.endpoint)
            yield from ((f"{at}.work.{field}", problem) for field, problem
                        in _http_problems(stage.work, endpoint.model if endpoint else None))
        if isinstance(stage.work, PythonWork):
            problem = _callable_problem(stage.work.callable)
            if problem:
                yield f"{at}.work.callable", problem
            for i, reference in enumerate(stage.work.transient):
                problem = _callable_problem(reference)
                if problem is None:
                    try:
                        exception_class(reference)
                    except TypeError as exc:
                        problem = str(exc)
                if problem:
                    yield f"{at}.work.transient.{i}", problem
        for i, route in enumerate(stage.routes):
            if route.to not in spec.topics:
                yield f"{at}.routes.{i}.to", f"topic {route.to!r} is not declared (declared: {declared})"
            if route.forward and route.fields:
                yield f"{at}.routes.{i}", "set either forward or fields, not both"
        if not stage.routes and not stage.join:
            yield f"{at}.routes", "a stage must route its outcome somewhere"
    if spec.failure_notice and spec.failure_notice.to not in spec.topics:
        yield "failure_notice.to", f"topic {spec.failure_notice.to!r} is not declared (declared: {declared})"
    if spec.load.measure not in spec.topics:
        yield "load.measure", f"topic {spec.load.measure!r} is not declared (declared: {declared})"
    problem = _callable_problem(spec.load.generator)
    if problem:
        yield "load.generator", problem
    if not spec.entry_stages:
        yield "stages", "every stage reads a topic another stage writes: nothing takes the load"
    if not any(r.status == "completed" for s in spec.stages.values() for r in s.routes):
        yield "stages", "no route completes a request (status: completed)"
    for name, endpoint in spec.endpoints.items():
        latency = endpoint.latency
        if latency.distribution == "lognormal" and (latency.p99_s or 0) <= latency.median_s:
            yield f"endpoints.{name}.latency.p99_s", "a lognormal latency needs a p99 above its median"
        if endpoint.model and endpoint.stand_in and endpoint.stand_in.protocol != "openai_chat":
            yield f"endpoints.{name}.model", "the stand-in tells apart by model only openai_chat endpoints"


def _http_problems(work: HttpWork, model: str | None) -> Iterable[tuple[str, str]]:
    """(field, problem) of an HTTP work: what its protocol needs and forbids, its templates'
    syntax, its kept paths."""
    chat_fields = {"model": work.model, "messages": work.messages, "max_tokens": work.max_tokens,
                   "temperature": work.temperature, "user": work.user}
    if work.protocol == "openai_chat":
        for name in ("request", "body"):
            if getattr(work, name):
                yield name, "an openai_chat work builds its own body: use model and messages"
        if not (work.model or model):
            yield "model", "an openai_chat work names its model, or its endpoint does"
        if not any(m.role == "user" for m in work.messages):
            yield "messages", "an openai_chat work needs a user message"
        templates: Any = [m.content for m in work.messages] + [work.user or ""]
    else:
        for name, value in chat_fields.items():
            if value:
                yield name, "only an openai_chat work takes it"
        if bool(work.request) == (work.body is not None):
            yield "body", "set either body (a template) or request (field -> event field)"
        if not work.keep:
            yield "keep", "name the answer fields the stage keeps"
        templates = work.body
    for problem in http_work.check(templates):
        yield "body" if work.protocol == "json" else "messages", f"template {problem}"
    for name, path in work.kept.items():
        try:
            http_work.steps(path)
        except ValueError as exc:
            yield f"keep.{name}", str(exc)


def _callable_problem(reference: str) -> str | None:
    try:
        resolve(reference)
    except (ImportError, AttributeError, TypeError) as exc:
        return f"cannot use {reference!r}: {exc}"
    return None


def resolve(reference: str) -> Callable[..., Any]:
    """The function a `module:function` reference names."""
    module, _, function = reference.partition(":")
    target = getattr(importlib.import_module(module), function)
    if not callable(target):
        raise TypeError(f"{reference} is not callable")
    return target


def exception_class(reference: str) -> type[BaseException]:
    """The exception class a `module:Class` reference names."""
    target = resolve(reference)
    if not (isinstance(target, type) and issubclass(target, BaseException)):
        raise TypeError(f"{reference!r} is not an exception class")
    return target


def parse(document: Any, source: str = "<spec>") -> PipelineSpec:
    """A validated spec from a decoded document; raises SpecError naming each field at fault."""
    if not isinstance(document, dict):
        raise SpecError(source, [("", f"expected a mapping, got {type(document).__name__}")])
    # `x-` keys hold YAML anchors shared by several fields, as in OpenAPI documents.
    document = {k: v for k, v in document.items() if not str(k).startswith("x-")}
    try:
        spec = PipelineSpec.model_validate(document)
    except ValidationError as exc:
        raise SpecError(source, [(".".join(str(p) for p in error["loc"]), error["msg"])
                                 for error in exc.errors()]) from None
    problems = list(_cross_checks(spec))
    if problems:
        raise SpecError(source, problems)
    return spec


def directory() -> Path:
    """Where specs are found: $PIPELINES_DIR, or the project's `pipelines/`."""
    return Path(os.environ.get("PIPELINES_DIR") or PIPELINES_DIR)


def available() -> list[str]:
    """The names of the specs found (file stems), for the DAG forms' dropdown."""
    return sorted(p.stem for p in directory().glob("*.yaml"))


def path_of(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate
    return directory() / f"{name_or_path}.yaml"


def load(name_or_path: str = REFERENCE) -> PipelineSpec:
    """The spec named `name` in the pipelines folder, or at a path; validated (and cached
    until the file changes)."""
    path = path_of(name_or_path)
    if not path.is_file():
        raise SpecError(str(path), [("", f"no such spec (found: {', '.join(available()) or 'none'})")])
    return _load(path.resolve(), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _load(path: Path, _mtime_ns: int) -> PipelineSpec:
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(str(path), [("", f"not YAML: {exc}")]) from None
    spec = parse(document, str(path))
    if path.stem != spec.name:
        raise SpecError(str(path), [("name", f"{spec.name!r} differs from the file's name {path.stem!r}")])
    return spec


def roles() -> tuple[str, ...]:
    """The principals pipelines run as on a secured cluster: the load source, and each stage
    name of every spec found (a stage name shared by two specs is one principal)."""
    return ("source", *sorted({stage for name in available() for stage in load(name).stages}))


def missing_connections(spec: PipelineSpec, exists: Callable[[str], bool]) -> list[tuple[str, str]]:
    """Endpoints whose connection is not defined where the pipeline will run."""
    return [(f"endpoints.{name}.connection", f"connection {e.connection!r} is not defined")
            for name, e in spec.endpoints.items() if not exists(e.connection)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m consumers.pipeline_spec", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = p.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="validate a spec (a name or a path)")
    check.add_argument("spec")
    commands.add_parser("list", help="the specs found")
    args = p.parse_args(argv)
    if args.command == "list":
        print("\n".join(available()))
        return 0
    try:
        spec = load(args.spec)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(spec.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
