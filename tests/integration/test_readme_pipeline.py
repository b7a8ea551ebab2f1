"""The README's minimal spec, loaded from the README itself and run against the stack."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from consumers import pipeline_spec
from consumers.pipeline import running_pipeline
from consumers.pipeline_config import PipelineConfig
from tests.integration.pipeline_fixtures import TIME_SCALE, AIService, ai_service, query
from tests.stack import Stack

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- minimal spec -->"


def readme_spec() -> str:
    block = README.read_text().split(MARKER)[1]
    found = re.search(r"```yaml\n(.*?)```", block, re.DOTALL)
    assert found, "the README's minimal spec block is missing"
    return found.group(1)


@pytest.fixture
def digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AIService]:
    """The stand-in serving the shipped specs and the README's, with the pipelines folder being
    a copy of the project's plus the README's spec."""
    for shipped in pipeline_spec.directory().glob("*.yaml"):
        (tmp_path / shipped.name).write_text(shipped.read_text())
    (tmp_path / "digest.yaml").write_text(readme_spec())
    monkeypatch.setenv("PIPELINES_DIR", str(tmp_path))
    with ai_service() as service:
        yield service


def test_the_readme_spec_is_valid_and_minimal() -> None:
    spec = pipeline_spec.parse(yaml.safe_load(readme_spec()), "README")
    assert spec.stage_names == spec.entry_stages == ("summarize",)
    assert spec.completing_stage == "summarize"


def test_the_readme_spec_runs_end_to_end(stack: Stack, digest: AIService) -> None:
    config = PipelineConfig(pipeline="digest", partitions=4, time_scale=TIME_SCALE, replication_factor=1)
    with running_pipeline(config, stack.kafka, stack.database_url, digest.endpoints_of("digest")) as pipeline:
        pipeline.send(40)
        counts = pipeline.wait_terminal(40, timeout_s=120)
    assert counts == {"completed": 40}
    rows = query(stack.database_url, "SELECT count(*), count(*) FILTER (WHERE result->>'summary' LIKE "
                 "'summary of %%') FROM stage_results WHERE run_id = %s AND pipeline = 'digest'",
                 pipeline.run_id)
    assert rows == [(40, 40)]
    assert digest.stats()["summarize"]["served"] == 40
