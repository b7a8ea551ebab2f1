"""Where specs are found and loaded: `pipelines/*.yaml`, or $PIPELINES_DIR; a spec by its name
(the file's stem) or its path, validated and cached until its file changes. The quotas their
endpoints spend are found in that folder's `quotas/`, one file each (out of the specs' glob)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from consumers.config.pipeline_spec.models import PipelineSpec, SpecError
from consumers.config.pipeline_spec.quota import QuotaSpec, parse_quota, spending_checks
from consumers.config.pipeline_spec.validation import parse
from consumers.config.pipeline_spec.work_changes import with_work_changes

PIPELINES_DIR = Path(__file__).resolve().parents[3] / "pipelines"
REFERENCE = "genai_image"
QUOTAS = "quotas"  # the quotas' folder, in the specs'


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


def load(name_or_path: str = REFERENCE,
         work_changes: Mapping[str, Mapping[str, Any]] | None = None) -> PipelineSpec:
    """The spec named `name` in the pipelines folder, or at a path; validated (and cached
    until the file changes), the quotas its endpoints name with it (`quota.spending_checks`).
    With a candidate configuration's `work_changes` (`work_changes.with_work_changes`), the
    spec as that configuration runs it: the changed calls are held to their quotas too."""
    path = path_of(name_or_path)
    if not path.is_file():
        raise SpecError(str(path), [("", f"no such spec (found: {', '.join(available()) or 'none'})")])
    spec = with_work_changes(_load(path.resolve(), path.stat().st_mtime_ns), work_changes or {})
    named = {e.quota for e in spec.endpoints.values() if e.quota}
    problems = list(spending_checks(spec, {q: load_quota(q) for q in named if quota_path_of(q).is_file()}))
    if problems:
        raise SpecError(str(path), problems)
    return spec


@functools.lru_cache(maxsize=64)
def _load(path: Path, _mtime_ns: int) -> PipelineSpec:
    spec = parse(_document(path, "pipeline spec"), str(path))
    _named_as_file(path, spec.name, "pipeline spec")
    return spec


def quota_directory() -> Path:
    """Where quotas are found: the specs' folder's `quotas/`."""
    return directory() / QUOTAS


def quota_names() -> list[str]:
    """The names of the quotas found (file stems in the specs' `quotas/`)."""
    return sorted(p.stem for p in quota_directory().glob("*.yaml"))


def is_quota(name_or_path: str) -> bool:
    """What the check command takes for a quota: `quotas/<name>`, or a path in a `quotas/` folder."""
    return Path(name_or_path).parent.name == QUOTAS


def quota_path_of(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate
    return quota_directory() / f"{candidate.name}.yaml"


def load_quota(name_or_path: str) -> QuotaSpec:
    """The quota named `name` (or `quotas/<name>`) in the specs' `quotas/`, or at a path;
    validated against the specs found, cached until its file changes or they do."""
    path = quota_path_of(name_or_path)
    if not path.is_file():
        raise SpecError(str(path), [("", f"no such quota (found: {', '.join(quota_names()) or 'none'})")],
                        "quota")
    return _load_quota(path.resolve(), path.stat().st_mtime_ns, tuple(available()))


def quotas() -> dict[str, QuotaSpec]:
    """Every quota found, by name."""
    return {name: load_quota(name) for name in quota_names()}


@functools.lru_cache(maxsize=64)
def _load_quota(path: Path, _mtime_ns: int, specs: tuple[str, ...]) -> QuotaSpec:
    quota = parse_quota(_document(path, "quota"), str(path), specs)
    _named_as_file(path, quota.name, "quota")
    return quota


def _document(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(str(path), [("", f"not YAML: {exc}")], what) from None


def _named_as_file(path: Path, name: str, what: str) -> None:
    """A spec or quota is found by its file's name: the name it declares must be that one."""
    if path.stem != name:
        raise SpecError(str(path), [("name", f"{name!r} differs from the file's name {path.stem!r}")], what)


def roles() -> tuple[str, ...]:
    """The principals pipelines run as on a secured cluster: the load source, and each stage
    name of every spec found (a stage name shared by two specs is one principal)."""
    return ("source", *sorted({stage for name in available() for stage in load(name).stages}))


def check(load_spec: Callable[[str], PipelineSpec | QuotaSpec], name_or_path: str) -> int:
    """A check command's answer: the spec's (or quota's) summary, or why it is refused (exit code 2)."""
    try:
        spec = load_spec(name_or_path)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(spec.summary())
    return 0
