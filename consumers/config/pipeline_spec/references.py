"""The code a spec names by `module:name` reference: load generators, custom work, the exception
classes a work raises when a dependency is down."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


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
