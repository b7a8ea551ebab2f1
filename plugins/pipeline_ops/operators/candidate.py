"""The configuration a run measures: the trigger form's candidate made a registered version."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from airflow.sdk import BaseOperator

from consumers.config import pipeline_spec, presets
from consumers.config.candidate import PipelineConfig
from pipeline_ops.registry import ConfigRegistry


class ResolveCandidateOperator(BaseOperator):
    """Turn the trigger form's candidate (a preset of the pipeline, or its `active` version) into
    a registered version."""

    template_fields = ("pipeline", "candidate", "overrides", "preset_params")

    def __init__(self, *, candidate: str, pipeline: str = pipeline_spec.REFERENCE,
                 overrides: dict | str | None = None, preset_params: dict | None = None,
                 run_prefix: str = "tuning", postgres_conn_id: str = "postgres_default",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.candidate, self.pipeline, self.overrides = candidate, pipeline, overrides or {}
        self.preset_params, self.run_prefix = preset_params or {}, run_prefix
        self.postgres_conn_id = postgres_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        registry = ConfigRegistry(self.postgres_conn_id)
        overrides = (json.loads(self.overrides) if isinstance(self.overrides, str) else self.overrides) or {}
        name, config = resolve(registry, self.pipeline, self.candidate, overrides, self.preset_params,
                               self.log)
        version = registry.register(name, config, note=f"from {context['run_id']}")
        run_id = f"{self.run_prefix}-{context['ts_nodash'].lower()}-v{version}"
        self.log.info("candidate %s of %s is version %d; run %s", name, self.pipeline, version, run_id)
        return {"version": version, "name": name, "pipeline": config.pipeline, "run_id": run_id,
                "config": config.to_dict()}


def resolve(registry: ConfigRegistry, pipeline: str, candidate: str, overrides: dict[str, Any],
            preset_params: dict[str, Any], log: Any) -> tuple[str, PipelineConfig]:
    """A form's candidate: the pipeline's `active` version, a registered version by number, or a
    preset (built with the form's preset parameters), with the form's overrides applied."""
    if overrides.get("pipeline", pipeline) != pipeline:
        raise ValueError(f"the overrides name the pipeline {overrides['pipeline']}: choose the pipeline "
                         f"with the form's `pipeline` field ({pipeline})")
    active = registry.active(pipeline) if candidate == "active" else None
    if candidate.isdigit():
        chosen = registry.get(int(candidate), pipeline)
        config, name = chosen.config, chosen.name
    elif active is not None:
        config, name = active.config, active.name
    else:
        name = "flow" if candidate == "active" else candidate
        if candidate == "active":
            log.info("no active configuration of %s yet: measuring the %s preset", pipeline, name)
        defaults = presets.PresetParams(pipeline=pipeline)
        params = replace(defaults, **{k: type(getattr(defaults, k))(v)  # form values may be text
                                      for k, v in preset_params.items() if hasattr(defaults, k)})
        config = presets.build(name, params)
    return name, config.with_overrides(overrides)
