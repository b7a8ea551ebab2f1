"""Refuse a pipeline before anything is provisioned for it: its spec must be valid and every AI
endpoint's Airflow connection must exist where the pipeline runs.

Every DAG that runs a pipeline starts with this check (`CheckPipelineOperator`), so a mistake in
a spec, or a connection nobody defined, fails the run's first task with the field at fault
(e.g. `stages.check.routes.1.to: ...`) rather than a half-provisioned run later. The same check
from a shell, with the stack's Airflow connections in the environment:

    python -m pipeline_ops.pipeline_check text_moderation
    python -m pipeline_ops.pipeline_check path/to/my_pipeline.yaml

Specs are looked up in $PIPELINES_DIR, or the project's `pipelines/`.
"""

from __future__ import annotations

import argparse

from airflow.exceptions import AirflowNotFoundException
from airflow.sdk import BaseHook

from consumers.config import pipeline_spec
from consumers.config.pipeline_spec import PipelineSpec, SpecError
from consumers.config.pipeline_spec.files import check


def connection_exists(conn_id: str) -> bool:
    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return False
    return True


def missing_connections(spec: PipelineSpec) -> list[tuple[str, str]]:
    """Endpoints whose connection is not defined where the pipeline will run."""
    return [(f"endpoints.{name}.connection", f"connection {e.connection!r} is not defined")
            for name, e in spec.endpoints.items() if not connection_exists(e.connection)]


def validated(name_or_path: str) -> PipelineSpec:
    """The spec, validated, whose endpoints' connections all exist; raises SpecError naming
    each field at fault."""
    spec = pipeline_spec.load(name_or_path)
    missing = missing_connections(spec)
    if missing:
        raise SpecError(str(pipeline_spec.path_of(name_or_path)), missing)
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline_ops.pipeline_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="a spec's name (in $PIPELINES_DIR or pipelines/) or path")
    return check(validated, parser.parse_args(argv).spec)


if __name__ == "__main__":
    raise SystemExit(main())
