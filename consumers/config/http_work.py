"""What an HTTP work sends and keeps: a request body rendered from the event, answer fields read by path.

A body template is JSON-shaped data whose strings are Jinja templates (the templating Airflow's
own fields use) over `event`, the stage's event: `"Classify: {{ event.ticket.subject }}"` renders
as text, and a string that is one expression alone, `"{{ event.max_words }}"`, keeps the
expression's own type (a number stays a number, a list a list). A field the template names and
the event lacks fails the render (`RenderError`): the event is not one this stage can call
for, the record's own fault, never a request sent with a hole in it.

Answer fields are kept by path: `choices[0].message.content`, `usage.completion_tokens`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from jinja2 import StrictUndefined, TemplateError, Undefined
from jinja2.sandbox import SandboxedEnvironment

# Sandboxed: a spec is data, and its templates must not reach Python objects beyond the event.
_ENV = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
_ALONE = re.compile(r"^\{\{(?P<expression>.*)\}\}$", re.DOTALL)
_STEP = re.compile(r"\.?([A-Za-z_][\w-]*)|\[(\d+)\]")


class RenderError(ValueError):
    """The event lacks a field the template names."""


@cache
def _compiled(text: str) -> Any:
    """A string's renderer: the expression's value when the string is one expression alone
    (and has no other `{{`), else the rendered text."""
    alone = _ALONE.match(text.strip())
    if alone and "{{" not in alone["expression"]:
        return _ENV.compile_expression(alone["expression"], undefined_to_none=False)
    template = _ENV.from_string(text)
    return template.render


def check(template: Any) -> list[str]:
    """Syntax errors of a template's strings (empty when it compiles), for the spec check."""
    problems = []
    for text in _strings(template):
        try:
            _compiled(text)
        except TemplateError as exc:
            problems.append(f"{text!r}: {exc}")
    return problems


def render(template: Any, event: Mapping[str, Any]) -> Any:
    """The template with every string rendered against `event`; raises RenderError when the
    event lacks what the template names."""
    if isinstance(template, dict):
        return {key: render(value, event) for key, value in template.items()}
    if isinstance(template, list):
        return [render(value, event) for value in template]
    if not isinstance(template, str) or "{" not in template:
        return template
    try:
        value = _compiled(template)(event=event)
    except TemplateError as exc:  # StrictUndefined: a field the event does not have
        raise RenderError(f"{template!r}: {exc}") from None
    if isinstance(value, Undefined):  # an expression alone hands back the undefined itself
        raise RenderError(f"{template!r}: the event has no such field")
    return value


def _strings(template: Any) -> list[str]:
    if isinstance(template, dict):
        return [s for value in template.values() for s in _strings(value)]
    if isinstance(template, list):
        return [s for value in template for s in _strings(value)]
    return [template] if isinstance(template, str) and "{" in template else []


def steps(path: str) -> list[str | int]:
    """A path's steps: `choices[0].message.content` -> ['choices', 0, 'message', 'content'];
    raises ValueError on anything else."""
    found, at = [], 0
    for match in _STEP.finditer(path):
        dotted = match[0].startswith(".")
        if match.start() != at or (match[1] is not None and dotted != (at > 0)):
            break
        found.append(match[1] if match[1] is not None else int(match[2]))
        at = match.end()
    if not found or at != len(path):
        raise ValueError(f"{path!r} is not a path like choices[0].message.content")
    return found


MISSING = object()


def pick(answer: Any, path: str) -> Any:
    """The answer's value at `path`, or MISSING."""
    value = answer
    for step in steps(path):
        if isinstance(step, int):
            if not isinstance(value, list) or step >= len(value):
                return MISSING
            value = value[step]
        elif isinstance(value, dict) and step in value:
            value = value[step]
        else:
            return MISSING
    return value
