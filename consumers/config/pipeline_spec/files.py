"""Where specs are found and loaded: `pipelines/*.yaml`, or $PIPELINES_DIR; a spec by its name
(the file's stem) or its path, validated and cached until its file changes."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from consumers.config.pipeline_spec.models import PipelineSpec, SpecError
from consumers.config.pipeline_spec.validation import parse

PIPELINES_DIR = Path(__file__).resolve().parents[3] / "pipelines"
REFERENCE = "genai_image"


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


def check(load_spec: Callable[[str], PipelineSpec], name_or_path: str) -> int:
    """A check command's answer: the spec's summary, or why it is refused (exit code 2)."""
    try:
        spec = load_spec(name_or_path)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(spec.summary())
    return 0
