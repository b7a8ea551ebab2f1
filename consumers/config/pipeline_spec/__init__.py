"""A pipeline declared as data: its topics, AI endpoints and stages, read from `pipelines/*.yaml`.

The runtime (`consumers.runtime.stages`), provisioning, the ACLs, the load source and the AI stand-in
read everything pipeline-specific from a `PipelineSpec`, so a team brings its own workload by
writing a spec, not by changing the platform. The package: the models (`models`), the checks
across fields (`validation`), the provider quotas endpoints of several pipelines share
(`quota`, one file each in `pipelines/quotas/`), the tiers endpoints sell and the deadlines
stages declare (`tiers`), the code a spec names (`references`), a
candidate configuration's changes to its stages' AI work (`work_changes`), where specs and
quotas are found (`files`), and a command to check one
(`python -m consumers.config.pipeline_spec check <spec>|quotas/<name>`).
"""

from consumers.config.pipeline_spec.files import (
    PIPELINES_DIR,
    REFERENCE,
    available,
    directory,
    load,
    load_quota,
    path_of,
    quota_names,
    quotas,
    roles,
)
from consumers.config.pipeline_spec.models import (
    DEAD_LETTER,
    RUN_FIELDS,
    TERMINAL_STATUSES,
    EndpointSpec,
    HttpWork,
    PipelineSpec,
    PythonWork,
    Route,
    SpecError,
    StageSpec,
)
from consumers.config.pipeline_spec.quota import LANES, Lane, PipelineShare, QuotaSpec, parse_quota
from consumers.config.pipeline_spec.references import resolve
from consumers.config.pipeline_spec.validation import parse
from consumers.config.pipeline_spec.work_changes import with_work_changes

__all__ = [
    "DEAD_LETTER", "LANES", "PIPELINES_DIR", "REFERENCE", "RUN_FIELDS", "TERMINAL_STATUSES", "EndpointSpec",
    "HttpWork", "Lane", "PipelineShare", "PipelineSpec", "PythonWork", "QuotaSpec", "Route", "SpecError",
    "StageSpec", "available", "directory", "load", "load_quota", "parse", "parse_quota", "path_of",
    "quota_names", "quotas", "resolve", "roles", "with_work_changes",
]
