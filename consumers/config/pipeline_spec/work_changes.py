"""A candidate configuration's changes to its stages' AI work: another endpoint the spec declares,
the model, the prompt, the token budget, the temperature.

A model or prompt switch is the change teams make most often, and a candidate must be able to
make it without a new spec, so that it can be measured, or canaried, against the active version
on the same pipeline. The changed spec is what everything that runs or judges the candidate
reads (`files.load` applies the changes, `PipelineConfig.spec` asks for them): the fleet, its
AI client and requests, the timeouts, the cost figures' prices, the stand-in's setup. So a stage
switched to another endpoint is limited, timed and priced as that endpoint declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from consumers.config.pipeline_spec.models import HttpWork, PipelineSpec, SpecError
from consumers.config.pipeline_spec.validation import http_problems

CHANGEABLE = ("endpoint", "model", "messages", "max_tokens", "temperature")
# The work protocol an endpoint's stand-in protocol answers.
WORK_PROTOCOLS = {"plain": "json", "openai_chat": "openai_chat"}
WHAT = "work changes of pipeline"  # how a refusal names what it refuses (SpecError)

Problems = list[tuple[str, str]]


def with_work_changes(spec: PipelineSpec, changes: Mapping[str, Mapping[str, Any]]) -> PipelineSpec:
    """`spec` with each stage's AI work changed as `changes` says ({stage: {field: value}}, the
    fields of CHANGEABLE); raises SpecError (a ValueError) naming each field at fault as
    `<stage>.work.<field>`, e.g. `draft.work.endpoint`.

    The copy keeps the cached properties the spec computed (`ai_stages`, `entry_stages`,
    `validators`): a work change keeps an AI stage an AI stage and touches no route or schema."""
    if not changes:
        return spec
    stages, problems = dict(spec.stages), []
    for name, change in changes.items():
        work, found = _changed(spec, name, change)
        problems += found
        if work is not None:
            stages[name] = stages[name].model_copy(update={"work": work})
    if problems:
        raise SpecError(spec.name, problems, WHAT)
    return spec.model_copy(update={"stages": stages})


def _changed(spec: PipelineSpec, stage: str, change: Any) -> tuple[HttpWork | None, Problems]:
    """The stage's work with `change` applied, and what is wrong with it."""
    at = f"{stage}.work"
    if stage not in spec.stages:
        return None, [(stage, f"{spec.name} has no stage {stage!r} (stages: {list(spec.stages)})")]
    work = spec.stages[stage].work
    if not isinstance(work, HttpWork):
        return None, [(at, "the stage calls no AI endpoint: only an AI work can be changed")]
    if not isinstance(change, Mapping):
        return None, [(at, f"expected an object of field: value, got {type(change).__name__}")]
    unknown = sorted(set(change) - set(CHANGEABLE))
    if unknown:
        return None, [(f"{at}.{key}", f"not a work change (changeable: {', '.join(CHANGEABLE)})")
                      for key in unknown]
    try:
        changed = HttpWork.model_validate({**work.model_dump(), **change})
    except ValidationError as exc:
        return None, [(".".join([at, *map(str, error["loc"])]), error["msg"]) for error in exc.errors()]
    endpoint = spec.endpoints.get(changed.endpoint)
    if endpoint is None:
        return None, [(f"{at}.endpoint", f"endpoint {changed.endpoint!r} is not declared "
                       f"(declared: {sorted(spec.endpoints)})")]
    problems = [(f"{at}.{field}", problem) for field, problem in http_problems(changed, endpoint.model)]
    if changed.endpoint != work.endpoint:
        problems += _protocol_problems(spec, changed, at)
    if {"endpoint", "model"} & set(change):
        problems += _model_problems(spec, changed, at)
    return changed, problems


def _protocol_problems(spec: PipelineSpec, work: HttpWork, at: str) -> Problems:
    """An endpoint switched to must speak the work's protocol, as its stand-in or the spec's other
    works that call it say; an endpoint nothing says it of is refused rather than guessed at."""
    speaks = _speaks(spec, work.endpoint)
    if work.protocol in speaks:
        return []
    said = (f"speaks {', '.join(sorted(speaks))}" if speaks
            else "declares no stand_in and no stage calls it: nothing says what it speaks")
    return [(f"{at}.endpoint", f"endpoint {work.endpoint!r} {said}, not the work's protocol {work.protocol}")]


def _speaks(spec: PipelineSpec, endpoint: str) -> set[str]:
    """The work protocols an endpoint is known to speak: its stand-in's, and those of the works
    that call it."""
    declared = spec.endpoints[endpoint].stand_in
    return ({WORK_PROTOCOLS[declared.protocol]} if declared else set()) | {
        stage.work.protocol for stage in spec.stages.values()
        if isinstance(stage.work, HttpWork) and stage.work.endpoint == endpoint}


def _model_problems(spec: PipelineSpec, work: HttpWork, at: str) -> Problems:
    """A chat work must not call, through its endpoint's address, the model another endpoint of
    the spec serves there: the calls would go to that model, and still be limited, timed and
    priced as its own endpoint's."""
    if work.protocol != "openai_chat":
        return []
    own = spec.endpoints[work.endpoint]
    model = work.model or own.model
    other = next((name for name, e in spec.endpoints.items() if name != work.endpoint and e.model == model
                  and (e.connection, e.path) == (own.connection, own.path)), None)
    if other is None:
        return []
    return [(f"{at}.model", f"model {model!r} is served at this address by endpoint {other!r}: the calls "
             f"would go to it, limited and priced as endpoint {work.endpoint!r}; switch the endpoint to "
             f"{other!r} instead")]
