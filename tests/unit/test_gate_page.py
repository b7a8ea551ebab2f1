"""The gate page's failures (pipeline_ops.ui): dead letters counted by pipeline, stage and reason
with a Redrive form prefilled from them, and each AI endpoint's circuit, closed when it never
moved (no services: the queries' rows are given)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from pipeline_ops import ui


class Rows:
    """A hook whose query returns the given rows, keeping the parameters it was asked with."""

    def __init__(self, rows: list[tuple]) -> None:
        self.rows, self.parameters = rows, None

    def get_records(self, sql: str, parameters: dict) -> list[tuple]:
        self.parameters = parameters
        return self.rows


def at(hour: int, minute: int) -> datetime:
    return datetime(2026, 3, 2, hour, minute, tzinfo=UTC)


def circuit(run_id: str, stage: str, state: str, when: datetime, openings: int,
            detail: str = "") -> dict[str, Any]:
    return {"run_id": run_id, "stage": stage, "endpoint": stage, "state": state, "detail": detail,
            "at": when, "openings": openings}


def deployed(run_id: str, stage: str, started: datetime) -> dict[str, Any]:
    return {"run_id": run_id, "stage": stage, "endpoint": stage, "started_at": started}


def test_circuits_that_are_not_closed_come_first_then_the_latest_change() -> None:
    got = ui.circuit_states([circuit("r1", "moderate", "closed", at(10, 5), 2),
                             circuit("r2", "summarize", "open", at(10, 1), 1, "http_5xx from 4 requests"),
                             circuit("r1", "classify", "half_open", at(10, 3), 1)], [])
    assert [(c["run_id"], c["stage"], c["state"]) for c in got] == [
        ("r1", "classify", "half_open"), ("r2", "summarize", "open"), ("r1", "moderate", "closed")]


def test_a_running_endpoint_without_transitions_is_closed_since_its_fleet_started() -> None:
    transitions = [circuit("r1", "moderate", "open", at(10, 1), 3, "timeouts")]
    fleets = [deployed("r1", "moderate", at(9, 0)),  # has a transition: shown once, as it is
              deployed("r3", "classify", at(9, 30)), deployed("r3", "classify", at(9, 30)),
              deployed("r3", "moderate", at(9, 40))]
    got = ui.circuit_states(transitions, fleets)
    assert got == [
        circuit("r1", "moderate", "open", at(10, 1), 3, "timeouts"),
        circuit("r3", "moderate", "closed", at(9, 40), 0, "no transition since the fleet started"),
        circuit("r3", "classify", "closed", at(9, 30), 0, "no transition since the fleet started")]


def test_equal_times_are_ordered_by_run_and_stage() -> None:
    got = ui.circuit_states([], [deployed("r2", "a", at(9, 0)), deployed("r1", "b", at(9, 0)),
                                 deployed("r1", "a", at(9, 0))])
    assert [(c["run_id"], c["stage"]) for c in got] == [("r1", "a"), ("r1", "b"), ("r2", "a")]


def test_running_fleets_name_the_endpoint_their_stage_calls() -> None:
    # text_moderation: moderate, summarize and classify call an endpoint of their own name; join
    # runs no AI work. A pipeline without a spec names no endpoint.
    moderation = {"pipeline": "text_moderation"}
    hook = Rows([("r1", "moderate", moderation, at(9, 0)), ("r1", "join", moderation, at(9, 0)),
                 ("r2", "check", {"pipeline": "no_such_pipeline"}, at(9, 0)),
                 ("r1", "gone", moderation, at(9, 0))])
    assert ui.deployed_endpoints(hook, run="r") == [deployed("r1", "moderate", at(9, 0))]
    assert hook.parameters == {"run": "r"}


def test_a_fleet_switched_to_another_endpoint_names_that_one() -> None:
    switched = {"pipeline": "support_tickets", "draft": {"work": {"endpoint": "large_model_next"}}}
    hook = Rows([("r1", "draft", switched, at(9, 0)), ("r1", "triage", switched, at(9, 0))])
    assert [d["endpoint"] for d in ui.deployed_endpoints(hook)] == ["large_model_next", "small_model"]


def test_times_are_shown_in_utc_whatever_the_session_zone() -> None:
    paris = timezone(timedelta(hours=1))
    latest = datetime(2026, 3, 2, 11, 0, tzinfo=paris)
    hook = Rows([("genai_image", "generate", "ai_unavailable", 75, 1, latest, 70)])
    (group,) = ui.dead_letter_groups(hook, "genai_image", "flow-", "count")
    assert group == {"pipeline": "genai_image", "stage": "generate", "reason": "ai_unavailable",
                     "letters": 75, "runs": 1, "latest": at(10, 0), "sent_back": 70}
    assert hook.parameters == {"pipeline": "genai_image", "run": "flow-", "by": "count", "limit": 50}


def render(**context: Any) -> str:
    base = {"decisions": [], "actives": [], "pipelines": [], "pipeline": None, "history": [], "alarms": [],
            "versions": [], "capacity": [], "latest": None, "plots": [], "results_dir": "results",
            "api_base": "/airflow", "rollback_dag": ui.ROLLBACK_DAG_ID, "redrive_dag": ui.REDRIVE_DAG_ID,
            "run": None, "letters_by": "latest", "dead_letters": [], "circuits": [], "quotas": [],
            "quota_minutes": 10, "quota_windows": {}, "quota_plots": {}, "canaries": [], "canary_plots": {}}
    return ui._templates.get_template("gate.html").render(**{**base, **context})


def test_the_page_counts_dead_letters_and_offers_each_group_for_redrive() -> None:
    groups = [{"pipeline": "genai_image", "stage": "generate", "reason": "ai_unavailable", "letters": 75,
               "runs": 2, "latest": at(10, 7), "sent_back": 70},
              {"pipeline": "genai_image", "stage": "check", "reason": "ai_bad_answer", "letters": 3,
               "runs": 1, "latest": at(9, 58), "sent_back": 0}]
    html = render(dead_letters=groups, run="flow-2026", letters_by="count")
    rows = re.findall(r'<tr data-pipeline="([^"]+)" data-stage="([^"]+)" data-reason="([^"]+)">(.*?)</tr>',
                      html, re.S)
    assert [r[:3] for r in rows] == [("genai_image", "generate", "ai_unavailable"),
                                     ("genai_image", "check", "ai_bad_answer")]
    first = rows[0][3]
    assert '<td class="num letters">75</td>' in first and '<td class="num runs">2</td>' in first
    assert '<td class="latest">2026-03-02 10:07:00</td>' in first
    assert '<td class="num sent-back">70</td>' in first
    assert first.count('class="plain redrive-select"') == 1
    # The run filter is kept in the filter and preselected in the Redrive form; the order is kept.
    assert '<input name="run" value="flow-2026" placeholder="any run">' in html
    assert html.count('value="flow-2026"') == 2
    assert '<option value="count" selected>' in html
    assert 'id="redrive-form" data-dag="pipeline_redrive"' in html
    assert 'id="redrive-button" disabled' in html  # until the DAG's defaults are in


def test_the_page_shows_each_circuit_with_its_state_since_and_openings() -> None:
    html = render(circuits=[circuit("r1", "moderate", "half_open", at(10, 3), 2, "probe <out>"),
                            circuit("r3", "classify", "closed", at(9, 30), 0)])
    row = re.search(r'<tr data-run-id="r1" data-stage="moderate">(.*?)</tr>', html, re.S).group(1)
    assert '<span class="badge state-half_open">half-open</span>' in row
    assert '<td class="since">2026-03-02 10:03:00</td>' in row
    assert '<td class="num openings">2</td>' in row
    assert '<td class="detail">probe &lt;out&gt;</td>' in row
    quiet = re.search(r'<tr data-run-id="r3" data-stage="classify">(.*?)</tr>', html, re.S).group(1)
    assert '<span class="badge state-closed">closed</span>' in quiet and '<td class="detail">–</td>' in quiet


def test_without_dead_letters_or_circuits_the_page_says_so() -> None:
    html = render(run="nightly-")
    assert "No dead letters in runs\n  <code>nightly-</code>…." in html
    assert "No circuit has moved in runs <code>nightly-</code>…" in html
    assert 'id="dead-letters-table"' not in html and 'id="circuits-table"' not in html
