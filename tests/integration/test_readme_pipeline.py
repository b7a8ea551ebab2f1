"""The documentation's specs (the minimal one, and one of a real model API), loaded from its
page on pipelines (docs/pipelines.md) itself and run against the stack."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from consumers.config import pipeline_spec
from consumers.config.candidate import PipelineConfig
from consumers.runs.pipeline_run import running_pipeline
from tests.integration.pipeline_fixtures import TIME_SCALE, AIService, ai_service, query
from tests.stack import Stack

SPECS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "pipelines.md"
MARKER = "<!-- minimal spec -->"


def readme_block(marker: str) -> str:
    block = SPECS_PAGE.read_text().split(marker)[1]
    found = re.search(r"```yaml\n(.*?)```", block, re.DOTALL)
    assert found, f"{SPECS_PAGE.name}'s block {marker} is missing"
    return found.group(1)


def readme_spec() -> str:
    return readme_block(MARKER)


@pytest.fixture
def digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AIService]:
    """The stand-in serving the shipped specs and the documentation's, with the pipelines folder
    being a copy of the project's plus the documentation's spec."""
    for shipped in pipeline_spec.directory().glob("*.yaml"):
        (tmp_path / shipped.name).write_text(shipped.read_text())
    (tmp_path / "digest.yaml").write_text(readme_spec())
    monkeypatch.setenv("PIPELINES_DIR", str(tmp_path))
    with ai_service() as service:
        yield service


def test_the_readme_spec_is_valid_and_minimal() -> None:
    spec = pipeline_spec.parse(yaml.safe_load(readme_spec()), "docs/pipelines.md")
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


REAL_API = "<!-- real api spec -->"


def real_api_spec() -> str:
    return readme_block(REAL_API)


def test_the_readme_real_api_spec_runs_against_an_openai_compatible_endpoint(
        stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ticket_answers.yaml").write_text(real_api_spec())
    with ai_service() as service:  # the shipped specs' endpoints: support_tickets' small-model too
        monkeypatch.setenv("PIPELINES_DIR", str(tmp_path))
        spec = pipeline_spec.load("ticket_answers")
        assert spec.endpoints["assistant"].stand_in is None  # a real API, as the stand-in sees it
        config = PipelineConfig(pipeline="ticket_answers", partitions=4, time_scale=TIME_SCALE,
                                replication_factor=1)
        with running_pipeline(config, stack.kafka, stack.database_url,
                              service.endpoints_of("ticket_answers")) as pipeline:
            pipeline.send(30, reject_share=0.0)
            counts = pipeline.wait_terminal(30, timeout_s=120)
        served = service.stats()["small_model"]
    assert counts == {"completed": 30}
    answers = dict(query(stack.database_url, "SELECT result->>'answer', count(*) FROM stage_results "
                         "WHERE run_id = %s GROUP BY 1", pipeline.run_id))
    assert set(answers) <= {"billing", "bug", "how_to"} and sum(answers.values()) == 30
    assert (served["served"], served["duplicate_served"]) == (30, 0)
