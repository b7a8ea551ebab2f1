"""The gate page's canaries (pipeline_ops.canary_page): a promoted and a rolled-back canary with
their steps, verdicts and checks side by side, a step that failed before it was judged, the
JSON route, and the plot of both sides over the canary's span (no services: the queries' rows
are given, the judged steps' figures written as the judge stores them)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from matplotlib.colors import to_hex

from measure.canary import Check, Verdict
from pipeline_ops import canary_page, ui
from tests.png import drawn
from tests.unit.test_gate_page import render

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
RANK = "shift <= 10% of the baseline's median (Hodges-Lehmann); fail when beyond it and one-sided p < 0.01"
RATE = "rate <= the baseline's + 0.01; fail when beyond it and one-sided two-proportion p < 0.01"


def s(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def canary(id_: int, state: str, reason: str, ended: float | None, stages: Sequence[str] = ("draft",),
           started: float = 0) -> tuple:
    """A row of CANARIES_SQL: support_tickets' v3 (flow) against v4 (next_model) on run `pipeline`."""
    return (id_, "support_tickets", "pipeline", 3, "flow", 4, "next_model", list(stages), state, reason,
            s(started), None if ended is None else s(ended))


def step(canary_id: int, n: int, share: float, partitions: int, window: tuple[float, float | None],
         verdict: str | None, decision: str | None, figures: dict) -> tuple:
    """A row of STEPS_SQL."""
    return (canary_id, n, share, partitions, s(window[0]), None if window[1] is None else s(window[1]),
            verdict, decision, figures)


def shares(baseline: tuple[int, int, float], candidate: tuple[int, int, float]) -> dict:
    """The quota share as the judge stores it: (partitions, AI calls, calls over partitions) per
    side, out of 10 partitions and the two sides' calls."""
    calls = baseline[1] + candidate[1]
    return {side: {"partitions": p, "partition_share": p / 10, "ai_calls": n, "call_share": n / calls,
                   "calls_over_partitions": ratio}
            for side, (p, n, ratio) in (("baseline", baseline), ("candidate", candidate))}


PASSED = Verdict("pass", (
    Check("latency", "pass", 1.93, 1.91, RANK, 0.42, 0.337, 0.0112,
          {"estimate": 0.0112, "low": -0.021, "high": 0.043, "confidence": 0.99}, {"n": [412, 47]},
          "within the tolerance"),
    Check("error_rate", "pass", 0.0, 0.0, RATE, 0.0, 1.0, 0.0,
          {"estimate": 0.0, "low": 0.0, "high": 0.0, "confidence": 0.99}, {"n": [412, 47]}),
    Check("keep_up", "pass", 1.0, 0.98, ">= 0.95 completions/arrivals on every candidate partition", 3.0)),
    shares((9, 410, 0.99), (1, 47, 1.03))).to_dict()
FAILED = Verdict("fail", (
    Check("latency", "fail", 2.61, 1.98, RANK, 9.81, 5e-23, 0.305,
          {"estimate": 0.305, "low": 0.27, "high": 0.34, "confidence": 0.99}, {"n": [420, 44]},
          "significantly worse, beyond the tolerance"),
    Check("cost_per_request", "fail", 0.0042, 0.0028, RANK, 8.2, 1.2e-16, 0.5,
          {"estimate": 0.5, "low": 0.46, "high": 0.55, "confidence": 0.99}, {"n": [420, 44]},
          "significantly worse, beyond the tolerance"),
    Check("dead_letter_rate", "marginal", 0.0227, 0.0, RATE, 3.1, 0.02, 0.0227,
          {"estimate": 0.0227, "low": -0.004, "high": 0.06, "confidence": 0.99}, {"n": [420, 44]},
          "beyond the tolerance but not significant")),
    shares((9, 810, 0.95), (1, 135, 1.43))).to_dict()
DIED = "the candidate stopped holding its partitions (its fleet died?)"

CANARIES = [
    canary(9, "running", "", None, started=300),
    canary(8, "rolled_back", "its fleet died", 220, started=200),
    canary(7, "rolled_back", "judged", 125, started=100),
    canary(6, "promoted", "every step passed (manual__2026-03-02)", 60, stages=("draft", "review")),
]
STEPS = [
    step(6, 1, 0.1, 2, (5, 15), "pass", "step_2: pass", PASSED),
    step(6, 2, 0.5, 10, (30, 40), "pass", "promote: pass", PASSED),
    step(7, 1, 0.1, 1, (105, 115), "fail", "rollback: fail", FAILED),
    step(8, 1, 0.1, 1, (204, 207.5), "fail", "rollback: fail", {"reason": DIED}),
    step(9, 1, 0.1, 1, (302, None), None, None, {}),
]


class Tables:
    """A hook answering each of the page's queries with the given rows, keeping the parameters;
    the canaries and steps filtered by the ids asked, as the queries do."""

    def __init__(self, canaries: Sequence[tuple] = CANARIES, steps: Sequence[tuple] = STEPS,
                 series: Sequence[tuple] = ()) -> None:
        self.canaries, self.steps, self.series = list(canaries), list(steps), list(series)
        self.parameters: dict[str, dict] = {}

    def get_records(self, sql: str, parameters: dict) -> list[tuple]:
        self.parameters[sql] = parameters
        if sql == canary_page.CANARIES_SQL:
            return [c for c in self.canaries if parameters["id"] in (None, c[0])][:parameters["limit"]]
        if sql == canary_page.STEPS_SQL:
            return [r for r in self.steps if r[0] in parameters["ids"]]
        assert sql == canary_page.SERIES_SQL
        return self.series


def by_id(canaries: list[dict]) -> dict[int, dict]:
    return {c["id"]: c for c in canaries}


def section(html: str, canary_id: int) -> str:
    return re.search(rf'<section class="canary" data-canary="{canary_id}">(.*?)</section>', html,
                     re.S).group(1)


def row(html: str, check: str) -> dict[str, str]:
    """A check's cells by class (the outcome's text without its tags)."""
    cells = re.search(rf'<tr data-check="{check}">(.*?)</tr>', html, re.S).group(1)
    return {k: " ".join(re.sub(r"<[^>]+>", "", v).split())
            for k, v in re.findall(r'<td class="(?:num |muted )?([\w-]+)">(.*?)</td>', cells, re.S)}


def page(canaries: list[dict]) -> str:
    return render(canaries=canaries,
                  canary_plots={c["id"]: f"/canaries/{c['id']}/plot.png" for c in canaries})


def test_a_promoted_canary_shows_its_versions_and_each_step_passed() -> None:
    found = canary_page.canaries(Tables())
    assert [c["id"] for c in found] == [9, 8, 7, 6]
    promoted = by_id(found)[6]
    assert {k: promoted[k] for k in ("pipeline", "run_id", "active_version", "active_name",
                                     "candidate_version", "candidate_name", "stages", "state", "started_at",
                                     "ended_at")} == {
        "pipeline": "support_tickets", "run_id": "pipeline", "active_version": 3, "active_name": "flow",
        "candidate_version": 4, "candidate_name": "next_model", "stages": ["draft", "review"],
        "state": "promoted", "started_at": NOW, "ended_at": NOW + timedelta(seconds=60)}
    first, second = promoted["steps"]
    assert {k: first[k] for k in ("step", "share", "partitions", "started_at", "ended_at", "verdict",
                                  "decision", "reason")} == {
        "step": 1, "share": 0.1, "partitions": 2, "started_at": s(5), "ended_at": s(15), "verdict": "pass",
        "decision": "step_2: pass", "reason": None}
    assert [c["name"] for c in first["checks"]] == ["latency", "error_rate", "keep_up"]
    assert (first["checks"][0]["measured"], first["checks"][0]["baseline"]) == (1.93, 1.91)
    assert first["quota_share"]["candidate"]["ai_calls"] == 47
    assert (second["partitions"], second["decision"]) == (10, "promote: pass")

    html = section(page(found), 6)
    assert '<span class="badge canary-promoted">promoted</span>' in html
    assert re.search(r"active v3 \(flow\) against\s+candidate v4 \(next_model\), changing draft, review",
                     html)
    assert re.search(r"Started 2026-03-02 10:00:00, ended\s+2026-03-02 10:01:00 UTC: every step passed", html)
    assert re.search(r"Step 1: 10% of the partitions \(2 lent\),\s+window 10:00:05–10:00:15\s+"
                     r'<span class="badge outcome-pass">pass</span>\s+'
                     r'<span class="decision">decided <code>step_2: pass</code>', html)
    assert "Step 2: 50% of the partitions (10 lent)" in html
    latency = row(html, "latency")
    assert {k: latency[k] for k in ("measured", "baseline", "statistic", "p-value", "effect", "outcome")} == {
        "measured": "1.930 s", "baseline": "1.910 s", "statistic": "0.42", "p-value": "0.337",
        "effect": "+1.1% [-2.1%, +4.3%]", "outcome": "pass within the tolerance"}
    assert latency["required"].startswith("shift &lt;= 10% of the baseline&#39;s median")
    assert row(html, "error_rate")["measured"] == "0.00%"
    keep_up = row(html, "keep_up")
    assert (keep_up["measured"], keep_up["baseline"], keep_up["statistic"], keep_up["effect"]) == (
        "1", "0.98", "3", "–")
    assert '<img src="/canaries/6/plot.png"' in html


def test_a_rolled_back_canary_shows_the_failed_checks_beside_the_baseline_and_the_quota_share() -> None:
    rolled_back = by_id(canary_page.canaries(Tables()))[7]
    assert (rolled_back["state"], rolled_back["reason"]) == ("rolled_back", "judged")
    (only,) = rolled_back["steps"]
    assert (only["verdict"], only["decision"]) == ("fail", "rollback: fail")
    assert [(c["name"], c["outcome"]) for c in only["checks"]] == [
        ("latency", "fail"), ("cost_per_request", "fail"), ("dead_letter_rate", "marginal")]

    html = section(page([rolled_back]), 7)
    assert '<span class="badge canary-rolled_back">rolled back</span>' in html
    assert "UTC: judged." in html
    latency = row(html, "latency")
    assert {k: latency[k] for k in ("measured", "baseline", "statistic", "p-value", "effect", "outcome")} == {
        "measured": "2.610 s", "baseline": "1.980 s", "statistic": "9.81", "p-value": "5e-23",
        "effect": "+30.5% [+27.0%, +34.0%]", "outcome": "fail significantly worse, beyond the tolerance"}
    cost = row(html, "cost_per_request")
    assert (cost["measured"], cost["baseline"], cost["effect"]) == (
        "0.0042", "0.0028", "+50.0% [+46.0%, +55.0%]")
    dead = row(html, "dead_letter_rate")
    assert (dead["measured"], dead["baseline"], dead["effect"]) == (
        "2.27%", "0.00%", "+2.27 pp [-0.40 pp, +6.00 pp]")
    assert dead["outcome"] == "marginal beyond the tolerance but not significant"
    # 810 and 135 of 945 calls against 9 and 1 of 10 partitions.
    sides = {side: dict(re.findall(r'<td class="num ([\w-]+)">([^<]*)</td>', cells))
             for side, cells in re.findall(r'<tr data-side="(\w+)">(.*?)</tr>', html, re.S)}
    assert sides == {
        "baseline": {"partitions": "9", "partition-share": "90%", "ai-calls": "810", "call-share": "86%",
                     "calls-over-partitions": "0.95"},
        "candidate": {"partitions": "1", "partition-share": "10%", "ai-calls": "135", "call-share": "14%",
                      "calls-over-partitions": "1.43"}}


def test_a_step_that_failed_before_judging_shows_why_and_one_measuring_says_so() -> None:
    found = by_id(canary_page.canaries(Tables()))
    (died,) = found[8]["steps"]
    assert (died["verdict"], died["checks"], died["quota_share"], died["reason"]) == ("fail", [], {}, DIED)
    (measuring,) = found[9]["steps"]
    assert (measuring["verdict"], measuring["ended_at"], measuring["reason"]) == (None, None, None)
    html = page(list(found.values()))
    dead = section(html, 8)
    assert f'<p class="step-reason">Not judged: {DIED}.</p>' in dead
    assert "canary-checks" not in dead and "data-side" not in dead
    running = section(html, 9)
    assert '<span class="badge canary-running">running</span>' in running and "ended" not in running
    assert "window 10:05:02–…" in running and "outcome-" not in running
    assert "Measuring…" in running


def test_without_canaries_the_page_says_so() -> None:
    assert "No canary yet" in render()
    assert canary_page.canaries(Tables(canaries=[])) == []


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> tuple[TestClient, Tables]:
    """The canary routes on an app of their own (the gate app's login is Airflow's), reading `hook`:
    canary 7 with completions on both sides in its first seconds."""
    hook = Tables(series=[(s(100), False, 9, 1.9), (s(100), True, 1, 2.5), (s(101), False, 8, 2.0),
                          (s(103), True, 2, 2.7)])
    monkeypatch.setattr(canary_page, "PostgresHook", lambda postgres_conn_id: hook)
    app = FastAPI()
    app.include_router(canary_page.routes("postgres_default"))
    return TestClient(app), hook


def test_the_gate_app_serves_the_canary_routes() -> None:
    assert ui.app.url_path_for("canary_plot", canary_id="7") == "/canaries/7/plot.png"
    assert "/api/canaries" in {route.path for route in ui.app.routes}


def test_the_json_route_gives_the_latest_canaries_and_their_steps(client: tuple[TestClient, Tables]) -> None:
    response = client[0].get("/api/canaries")
    assert response.status_code == 200
    found = response.json()
    assert [c["id"] for c in found] == [9, 8, 7, 6]
    assert client[1].parameters[canary_page.CANARIES_SQL] == {"id": None, "limit": 10}
    assert client[1].parameters[canary_page.STEPS_SQL] == {"ids": [9, 8, 7, 6]}
    rolled_back = found[2]
    assert set(rolled_back) == {"id", "pipeline", "run_id", "active_version", "active_name",
                                "candidate_version", "candidate_name", "stages", "state", "reason",
                                "started_at", "ended_at", "steps"}
    assert datetime.fromisoformat(rolled_back["ended_at"]) == NOW + timedelta(seconds=125)
    (only,) = rolled_back["steps"]
    assert set(only) == {"step", "share", "partitions", "started_at", "ended_at", "verdict", "decision",
                         "checks", "quota_share", "reason"}
    latency = only["checks"][0]
    assert {k: latency[k] for k in ("name", "measured", "baseline", "p_value", "effect")} == {
        "name": "latency", "measured": 2.61, "baseline": 1.98, "p_value": 5e-23, "effect": 0.305}
    assert only["quota_share"]["candidate"]["calls_over_partitions"] == 1.43
    assert found[1]["steps"][0]["reason"] == DIED
    assert found[0]["ended_at"] is None and found[0]["steps"][0]["ended_at"] is None


def test_the_plot_route_draws_a_png_of_the_canarys_span(client: tuple[TestClient, Tables],
                                                        tmp_path: Path) -> None:
    test_client, hook = client
    response = test_client.get("/canaries/7/plot.png")
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    (tmp_path / "canary.png").write_bytes(response.content)
    width, height, first_series = drawn(tmp_path / "canary.png")
    assert (width, height) == (800, 500) and first_series > 0  # the active side's lines
    assert hook.parameters[canary_page.CANARIES_SQL] == {"id": 7, "limit": 1}
    assert hook.parameters[canary_page.SERIES_SQL] == {"run": "pipeline", "stages": ["draft"], "canary": 7,
                                                       "start": s(100), "end": s(125), "step": 1}
    before = datetime.now(UTC)
    assert test_client.get("/canaries/9/plot.png").status_code == 200  # running: until now
    assert hook.parameters[canary_page.SERIES_SQL]["end"] >= before
    assert test_client.get("/canaries/5/plot.png").status_code == 404
    assert test_client.get("/canaries/latest/plot.png").status_code == 422


def test_the_plot_has_every_second_of_both_sides_and_shades_each_window_by_its_verdict() -> None:
    hook = Tables(series=[(s(100), False, 9, 1.9), (s(100), True, 1, 2.5), (s(101), False, 8, 2.0),
                          (s(103), True, 2, None)])
    rolled_back = by_id(canary_page.canaries(hook))[7]
    found = canary_page.series(hook, rolled_back, s(104.5))
    seconds = [s(100), s(101), s(102), s(103), s(104)]
    assert found["active"]["at"] == seconds and found["candidate"]["at"] == seconds
    assert found["active"]["completions"] == [9, 8, 0, 0, 0]
    assert found["candidate"]["completions"] == [1, 0, 0, 2, 0]
    assert found["active"]["median_latency_s"][:2] == [1.9, 2.0]
    assert all(math.isnan(v) for v in found["active"]["median_latency_s"][2:])
    assert found["candidate"]["median_latency_s"][0] == 2.5  # then no completion, then none notified yet
    assert all(math.isnan(v) for v in found["candidate"]["median_latency_s"][1:])

    mixed = {**rolled_back, "steps": [
        {**rolled_back["steps"][0], "started_at": s(100), "ended_at": s(101)},
        {**rolled_back["steps"][0], "step": 2, "share": 0.5, "verdict": "marginal", "started_at": s(102),
         "ended_at": s(103)},
        {**rolled_back["steps"][0], "step": 3, "share": 0.75, "verdict": None, "started_at": s(103.5),
         "ended_at": None}]}
    fig = canary_page.figure(mixed, found, s(104.5))
    completions, latency = fig.axes
    assert {line.get_label(): list(line.get_ydata()) for line in completions.get_lines()
            if not line.get_label().startswith("_")} == {"active v3": [9, 8, 0, 0, 0],
                                                         "candidate v4": [1, 0, 0, 2, 0]}
    # tab:red (fail), tab:orange (marginal), grey while measuring, in both panels.
    for ax in (completions, latency):
        assert [to_hex(p.get_facecolor()) for p in ax.patches] == ["#d62728", "#ff7f0e", "#808080"]
    assert [t.get_text() for t in completions.texts] == ["step 1: 10%", "step 2: 50%", "step 3: 75%"]
    assert completions.get_title() == "canary 7: support_tickets draft"


def test_a_span_longer_than_an_hour_is_drawn_in_wider_points_at_the_same_rate() -> None:
    # 2 h 30 min over 3,600 points: 2.5 s, so points of 3 s from 10:00:00; 12 completions in the
    # point at 10:00:03 are 4 a second.
    hook = Tables(series=[(s(3), False, 12, 2.0)])
    promoted = by_id(canary_page.canaries(hook))[6]
    found = canary_page.series(hook, promoted, s(9000))
    assert hook.parameters[canary_page.SERIES_SQL]["step"] == 3
    assert found["active"]["at"][:3] == [s(0), s(3), s(6)] and found["active"]["at"][-1] == s(9000)
    assert len(found["active"]["at"]) == 3001
    assert found["active"]["completions"][:3] == [0, 4, 0]
