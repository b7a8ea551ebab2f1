"""A spec validated whole before anything is provisioned: pydantic checks every field, then the
cross-checks here what spans fields (a route to an undeclared topic, a work naming an undeclared
endpoint, a schema that is not JSON Schema, a reference to code that does not import). Every
mistake comes back as `SpecError` with the path of the field at fault, e.g.
`stages.check.routes.1.to: ...`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ValidationError

from consumers.config import http_work
from consumers.config.pipeline_spec.models import (
    DEAD_LETTER,
    RUN_FIELDS,
    HttpWork,
    PipelineSpec,
    PythonWork,
    SpecError,
)
from consumers.config.pipeline_spec.references import exception_class, resolve
from consumers.config.pipeline_spec.tiers import endpoint_tier_checks, stage_tier_checks

M = TypeVar("M", bound=BaseModel)


def parse(document: Any, source: str = "<spec>") -> PipelineSpec:
    """A validated spec from a decoded document; raises SpecError naming each field at fault.

    It judges the document alone, reading no other file: a spec given as data (a test's, the
    docs' blocks) means the same wherever it is parsed. What it shares with other files, the
    quotas its endpoints spend, is checked where specs are loaded from their folder
    (`files.load`, `quota.spending_checks`)."""
    spec = model_of(PipelineSpec, document, source)
    problems = list(cross_checks(spec))
    if problems:
        raise SpecError(source, problems)
    return spec


def model_of(model: type[M], document: Any, source: str, what: str = "pipeline spec") -> M:
    """A decoded document as `model`, each field checked by its type; raises SpecError naming
    each field at fault."""
    if not isinstance(document, dict):
        raise SpecError(source, [("", f"expected a mapping, got {type(document).__name__}")], what)
    # `x-` keys hold YAML anchors shared by several fields, as in OpenAPI documents.
    document = {k: v for k, v in document.items() if not str(k).startswith("x-")}
    try:
        return model.model_validate(document)
    except ValidationError as exc:  # a mapping's key at fault is named as its entry (`lanes.fast`)
        raise SpecError(source, [(".".join(str(p) for p in error["loc"] if p != "[key]"), error["msg"])
                                 for error in exc.errors()], what) from None


def cross_checks(spec: PipelineSpec) -> Iterable[tuple[str, str]]:
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
                        in http_problems(stage.work, endpoint.model if endpoint else None))
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
        yield from endpoint_tier_checks(name, endpoint)
    yield from stage_tier_checks(spec)


def http_problems(work: HttpWork, model: str | None) -> Iterable[tuple[str, str]]:
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
