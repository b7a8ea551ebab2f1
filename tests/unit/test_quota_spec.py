"""Provider quotas (`pipelines/quotas/<name>.yaml`): declared once, named by endpoints of any
pipeline, each mistake refused with the path of the field at fault, in the quota file or in the
spec that names it. Specs and quotas are read from a $PIPELINES_DIR holding copies (`spec_copies`)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from consumers.config import pipeline_spec
from consumers.config.pipeline_spec.__main__ import main
from infra.layout import REPO

LAB = {"name": "lab", "concurrency": 96, "requests_per_minute": 1200, "tokens_per_minute": 400000,
       "lanes": {"batch": {"reserve": 0.1}},
       "pipelines": {"support_tickets": {"weight": 2, "lane": "interactive"},
                     "text_moderation": {"weight": 1}}}


def write_quota(folder: Path, document: dict[str, Any], stem: str = "lab") -> None:
    path = folder / "quotas" / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 1_000_000_000))  # a rewrite within a tick is seen


def spend(folder: Path, pipeline: str, endpoint: str, quota: str = "lab") -> None:
    """Name `quota` on the pipeline's endpoint."""
    path = folder / f"{pipeline}.yaml"
    spec = yaml.safe_load(path.read_text())
    spec["endpoints"][endpoint]["quota"] = quota
    path.write_text(yaml.safe_dump(spec, sort_keys=False))


def refusals(raised: pytest.ExceptionInfo[pipeline_spec.SpecError]) -> dict[str, str]:
    return dict(raised.value.problems)


def test_the_shipped_quota_is_the_ai_service_account_of_both_pipelines_that_call_it() -> None:
    """Its concurrency is the sum of the endpoints on the `ai_service` connection (64 each, five),
    shared evenly; it is out of the specs' list and the DAG forms' dropdown."""
    quota = pipeline_spec.load_quota("ai_service")
    on_account = {name: [e.concurrency for e in pipeline_spec.load(name).endpoints.values()
                         if e.connection == "ai_service"] for name in pipeline_spec.available()}
    callers = {name for name, slots in on_account.items() if slots}
    assert callers == set(quota.pipelines) == {"genai_image", "text_moderation"}
    assert quota.concurrency == sum(sum(slots) for slots in on_account.values()) == 320
    assert (quota.requests_per_minute, quota.tokens_per_minute) == (None, None)
    assert {p: (s.weight, s.lane) for p, s in quota.pipelines.items()} == {
        "genai_image": (1.0, "standard"), "text_moderation": (1.0, "standard")}
    assert pipeline_spec.quotas() == {"ai_service": quota}
    assert "ai_service" not in pipeline_spec.available()


def test_a_quota_file_gives_each_pipeline_its_weight_and_lane(spec_copies: Path) -> None:
    write_quota(spec_copies, LAB)
    quota = pipeline_spec.load_quota("lab")
    assert pipeline_spec.LANES == ("interactive", "standard", "batch")
    share = pipeline_spec.PipelineShare
    assert quota.share_of("support_tickets") == share(weight=2.0, lane="interactive")
    assert quota.share_of("text_moderation") == share(weight=1.0, lane="standard")
    assert quota.share_of("genai_image") == share(weight=1.0, lane="standard")  # not listed
    assert quota.lanes["batch"].reserve == 0.1
    assert set(pipeline_spec.quotas()) == {"ai_service", "lab"}
    by_path = pipeline_spec.load_quota(str(spec_copies / "quotas/lab.yaml"))
    assert pipeline_spec.load_quota("quotas/lab") == by_path == quota


def test_a_changed_quota_file_is_read_again(spec_copies: Path) -> None:
    write_quota(spec_copies, LAB)
    assert pipeline_spec.load_quota("lab").concurrency == 96
    write_quota(spec_copies, {**LAB, "concurrency": 48})
    assert pipeline_spec.load_quota("lab").concurrency == 48


# (how the quota is broken, the field path the refusal names, what it says)
BROKEN_QUOTAS = {
    "zero weight": ({"pipelines": {"text_moderation": {"weight": 0}}}, "pipelines.text_moderation.weight",
                    "Input should be greater than 0"),
    "negative weight": ({"pipelines": {"text_moderation": {"weight": -1.5}}},
                        "pipelines.text_moderation.weight", "Input should be greater than 0"),
    "unknown lane of a pipeline": ({"pipelines": {"text_moderation": {"lane": "urgent"}}},
                                   "pipelines.text_moderation.lane", "Input should be 'interactive', "
                                   "'standard' or 'batch'"),
    "unknown lane reserved": ({"lanes": {"fast": {"reserve": 0.2}}}, "lanes.fast",
                              "Input should be 'interactive', 'standard' or 'batch'"),
    "reserves over the whole": ({"lanes": {"batch": {"reserve": 0.6}, "standard": {"reserve": 0.5}}}, "lanes",
                                "the reserves sum to 1.1, more than the whole quota"),
    "a whole lane reserved": ({"lanes": {"batch": {"reserve": 1}}}, "lanes.batch.reserve",
                              "Input should be less than 1"),
    "unknown pipeline": ({"pipelines": {"digest": {"weight": 1}}}, "pipelines.digest",
                         "no spec 'digest' (found: genai_image, support_tickets, text_moderation)"),
    "no limit": ({"concurrency": None, "requests_per_minute": None, "tokens_per_minute": None}, "",
                 "declare at least one of concurrency, requests_per_minute, tokens_per_minute"),
    "unknown field": ({"burst": 10}, "burst", "Extra inputs are not permitted"),
    "another name": ({"name": "lab_account"}, "name", "'lab_account' differs from the file's name 'lab'"),
}


@pytest.mark.parametrize("case", BROKEN_QUOTAS)
def test_a_broken_quota_is_refused_naming_the_field(spec_copies: Path, case: str) -> None:
    change, path, message = BROKEN_QUOTAS[case]
    write_quota(spec_copies, {**LAB, **change})
    with pytest.raises(pipeline_spec.SpecError) as refused:
        pipeline_spec.load_quota("lab")
    assert refusals(refused) == {path: message}
    assert str(refused.value).startswith(f"quota {spec_copies / 'quotas/lab.yaml'} refused:")


def test_a_lane_may_reserve_what_the_others_leave(spec_copies: Path) -> None:
    write_quota(spec_copies, {**LAB, "lanes": {"batch": {"reserve": 0.5}, "standard": {"reserve": 0.5}}})
    assert sum(lane.reserve for lane in pipeline_spec.load_quota("lab").lanes.values()) == 1.0


def test_an_endpoint_names_the_quota_it_spends(spec_copies: Path) -> None:
    """Endpoints of two pipelines on one quota; its concurrency below an endpoint's own (64) is
    allowed: the quota binds. The spec's summary names it."""
    write_quota(spec_copies, {**LAB, "concurrency": 32})
    spend(spec_copies, "support_tickets", "large_model")
    spend(spec_copies, "text_moderation", "summarize")
    assert pipeline_spec.load("support_tickets").endpoints["large_model"].quota == "lab"
    assert "summarize on connection ai_service (quota lab)" in pipeline_spec.load("text_moderation").summary()
    assert "moderate on connection ai_service," in pipeline_spec.load("text_moderation").summary()


def test_an_endpoint_naming_an_undeclared_quota_is_refused(spec_copies: Path) -> None:
    spend(spec_copies, "text_moderation", "classify", "lab_account")
    with pytest.raises(pipeline_spec.SpecError) as refused:
        pipeline_spec.load("text_moderation")
    assert refusals(refused) == {
        "endpoints.classify.quota": "quota 'lab_account' is not declared (no quotas/lab_account.yaml)"}


def test_an_endpoint_naming_a_broken_quota_is_refused_with_the_quota_field(spec_copies: Path) -> None:
    write_quota(spec_copies, {**LAB, "pipelines": {"text_moderation": {"weight": 0}}})
    spend(spec_copies, "text_moderation", "classify")
    with pytest.raises(pipeline_spec.SpecError) as refused:
        pipeline_spec.load("text_moderation")
    assert refusals(refused) == {"pipelines.text_moderation.weight": "Input should be greater than 0"}
    assert refused.value.source == str(spec_copies / "quotas/lab.yaml")


@pytest.mark.parametrize(("tokens_per_minute", "tokens", "refused"), [
    (100, "total", True),  # draft's max_tokens 160 never fits a minute's 100
    (100, "output", True),
    (100, "input", False),  # the prompt's tokens alone count: max_tokens says nothing of them
    (160, "total", False),  # one call a minute fits
])
def test_a_quota_whose_minute_cannot_hold_one_call_is_refused(spec_copies: Path, tokens_per_minute: int,
                                                              tokens: str, refused: bool) -> None:
    write_quota(spec_copies, {**LAB, "tokens_per_minute": tokens_per_minute, "tokens": tokens})
    spend(spec_copies, "support_tickets", "large_model")
    if not refused:
        pipeline_spec.load("support_tickets")
        return
    with pytest.raises(pipeline_spec.SpecError) as raised:
        pipeline_spec.load("support_tickets")
    assert refusals(raised) == {"stages.draft.work.max_tokens": (
        "a call may spend 160 tokens, more than quota 'lab' meters in a minute (100): "
        "it would never be admitted")}


def test_the_check_command_checks_a_quota(spec_copies: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_quota(spec_copies, LAB)
    assert main(["check", "quotas/lab"]) == 0
    assert capsys.readouterr().out == (
        "lab: concurrency 96, requests per minute 1200, tokens per minute 400000 (total tokens); "
        "batch reserves 0.1; pipelines support_tickets weight 2 in interactive, text_moderation weight 1 "
        "in standard (any other: weight 1 in standard)\n")
    assert main(["list"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["quotas/ai_service", "quotas/lab"]
    write_quota(spec_copies, {**LAB, "lanes": {"bulk": {"reserve": 0.1}}})
    assert main(["check", str(spec_copies / "quotas/lab.yaml")]) == 2
    assert "lanes.bulk: Input should be" in capsys.readouterr().err


def test_the_documented_quota_file_is_valid() -> None:
    block = (REPO / "docs" / "pipelines.md").read_text().split("<!-- quota file -->")[1]
    document = yaml.safe_load(re.fullmatch(r"\s*```yaml\n(.*)```\s*", block, re.DOTALL)[1])
    quota = pipeline_spec.parse_quota(document, "docs/pipelines.md", pipeline_spec.available())
    assert quota.share_of("text_moderation") == pipeline_spec.PipelineShare(weight=1.0, lane="standard")
