"""The gate page's shared quotas (pipeline_ops.quota_page): each pipeline's live holders summed,
its fair share worked by hand, lapsed holders shown apart and still counted, the backlog per
lane, the JSON route and the plot route (no services: the queries' rows are given)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from pipeline_ops import quota_page, ui
from tests.unit.test_gate_page import render

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


class Tables:
    """A hook answering each of the page's queries with the given rows, keeping the parameters."""

    def __init__(self, limits: list[tuple], claims: Sequence[tuple] = (),
                 history: Sequence[tuple] = ()) -> None:
        self.rows = {quota_page.LIMITS_SQL: limits, quota_page.CLAIMS_SQL: list(claims),
                     quota_page.HISTORY_SQL: list(history)}
        self.parameters: dict[str, dict | None] = {}

    def get_records(self, sql: str, parameters: dict | None = None) -> list[tuple]:
        self.parameters[sql] = parameters
        return self.rows[sql]


def limits(quota: str = "shared", calls: int | None = 48, requests: float | None = None) -> tuple:
    return (quota, calls, requests, None, NOW)


def claim(holder: str, pipeline: str, weight: float = 1.0, demand: float = 48.0, granted: int = 0,
          in_use: int = 0, lane: str = "standard", live: bool = True, requests: tuple[float, float] = (0, 0),
          quota: str = "shared") -> tuple:
    """A row of CLAIMS_SQL; `requests`: (demand, granted) a minute."""
    expires = NOW + timedelta(seconds=2) if live else NOW - timedelta(seconds=1)
    return (quota, holder, pipeline, "generate", "run-1", lane, weight, demand, requests[0], 0.0, granted,
            requests[1], 0.0, in_use, expires, expires + timedelta(seconds=60), live)


def only(quotas: list[dict]) -> dict:
    (quota,) = quotas
    return quota


def by_pipeline(quota: dict) -> dict[str, dict]:
    return {p["pipeline"]: p for p in quota["pipelines"]}


def test_a_pipeline_sums_its_live_holders_claims() -> None:
    hook = Tables([limits(requests=600.0)], [
        claim("a-1", "tenant_a", 2, demand=30, granted=14, in_use=12, requests=(400, 150)),
        claim("a-2", "tenant_a", 2, demand=18, granted=10, in_use=9, requests=(200, 150)),
        claim("b-1", "tenant_b", 1, demand=20, granted=20, in_use=20, requests=(100, 100))])
    quota = only(quota_page.quotas(hook))
    assert quota["limits"] == {"calls": 48, "requests": 600.0}  # tokens are not metered
    a = by_pipeline(quota)["tenant_a"]
    assert (a["lane"], a["weight"], a["holders"], a["in_use"]) == ("standard", 2, 2, 21)
    assert a["demand"] == {"calls": 48, "requests": 600}
    assert a["granted"] == {"calls": 24, "requests": 300}
    assert (quota["granted"], quota["in_use"]) == ({"calls": 44, "requests": 400}, 41)


def test_fair_shares_by_weight_when_every_pipeline_is_backlogged() -> None:
    # Weights 2 : 1 : 1 of 48 calls, each asking for all 48: 48 * 2/4, 48 * 1/4, 48 * 1/4.
    hook = Tables([limits()], [claim("a-1", "tenant_a", 2), claim("b-1", "tenant_b"),
                               claim("c-1", "tenant_c")])
    fair = {name: p["fair"] for name, p in by_pipeline(only(quota_page.quotas(hook))).items()}
    assert fair == {"tenant_a": {"calls": 24}, "tenant_b": {"calls": 12}, "tenant_c": {"calls": 12}}


def test_a_pipeline_asking_less_than_its_share_leaves_the_rest_to_the_others_by_weight() -> None:
    # tenant_c asks for 4 of its 12: it gets 4, and a and b share the other 44 by 2 : 1.
    hook = Tables([limits()], [claim("a-1", "tenant_a", 2), claim("b-1", "tenant_b"),
                               claim("c-1", "tenant_c", demand=4)])
    fair = {name: p["fair"]["calls"] for name, p in by_pipeline(only(quota_page.quotas(hook))).items()}
    assert fair == pytest.approx({"tenant_a": 44 * 2 / 3, "tenant_b": 44 / 3, "tenant_c": 4})


def test_each_lane_is_shared_on_its_own() -> None:
    # One lane at a time, as if it had the whole quota: the interactive pipeline's 10 is its
    # demand, the standard lane's two share all 48.
    hook = Tables([limits()], [claim("i-1", "chat", demand=10, lane="interactive"),
                               claim("a-1", "tenant_a"), claim("b-1", "tenant_b")])
    quota = only(quota_page.quotas(hook))
    assert [(p["pipeline"], p["fair"]["calls"]) for p in quota["pipelines"]] == [
        ("chat", 10), ("tenant_a", 24), ("tenant_b", 24)]


def test_a_lapsed_holder_is_shown_apart_and_still_counts() -> None:
    hook = Tables([limits()], [claim("a-1", "tenant_a", demand=20, granted=20, in_use=18),
                               claim("a-2", "tenant_a", demand=20, granted=6, in_use=4, live=False),
                               claim("b-1", "tenant_b", demand=10, granted=8, in_use=8, live=False)])
    quota = only(quota_page.quotas(hook))
    a, b = by_pipeline(quota)["tenant_a"], by_pipeline(quota)["tenant_b"]
    assert (a["holders"], a["granted"], a["in_use"]) == (1, {"calls": 20}, 18)
    assert [h["holder"] for h in a["lapsed"]] == ["a-2"]
    assert a["lapsed"][0]["granted"] == {"calls": 6} and a["lapsed"][0]["in_use"] == 4
    # tenant_b has no live holder: no share of its own, only its lapsed grant counted.
    assert (b["holders"], b["granted"], b["fair"]) == (0, {"calls": 0}, {})
    assert a["fair"] == {"calls": 20}  # its live demand, what a fair allocation gives when it asks less
    assert quota["granted"] == {"calls": 34} and quota["lapsed_granted"] == {"calls": 14}
    assert quota["in_use"] == 30
    html = render(quotas=[quota], quota_minutes=10, quota_plots={"shared": "/quotas/shared/plot.png"})
    row = re.search(r'<tr data-pipeline="tenant_a">(.*?)</tr>', html, re.S).group(1)
    assert '<div data-holder="a-2"><span class="badge lapsed">lapsed</span>' in row
    assert "counted\n          until 10:00:59 UTC" in row
    assert "of which\n  14 calls at once\n  to lapsed holders" in html


def test_the_backlog_of_each_lane_is_demand_less_grant() -> None:
    hook = Tables([limits(requests=600.0)], [
        claim("i-1", "chat", demand=6, granted=6, lane="interactive", requests=(90, 90)),
        claim("a-1", "tenant_a", 2, demand=48, granted=28, requests=(400, 350)),
        claim("b-1", "tenant_b", demand=20, granted=14, requests=(100, 160))])
    quota = only(quota_page.quotas(hook))
    assert quota["backlog"] == [
        {"lane": "interactive", "waiting": []},
        {"lane": "standard", "waiting": [{"pipeline": "tenant_a", "waiting": {"calls": 20, "requests": 50}},
                                         {"pipeline": "tenant_b", "waiting": {"calls": 6}}]}]
    html = render(quotas=[quota], quota_minutes=10, quota_plots={"shared": "/quotas/shared/plot.png"})
    assert re.search(r'<li data-lane="interactive">Waiting in lane interactive:\s*none</li>', html)
    standard = re.search(r'<li data-lane="standard">(.*?)</li>', html, re.S).group(1)
    assert re.search(r"tenant_a\s+20 calls at once, 50 requests a minute", standard)
    assert re.search(r"tenant_b\s+6 calls at once", standard)


def test_the_page_shows_each_quota_its_pipelines_and_its_plot() -> None:
    hook = Tables([limits("ai_service", 320), limits("shared")], [
        claim("g-1", "genai_image", demand=200, granted=160, in_use=150, quota="ai_service"),
        claim("t-1", "text_moderation", demand=200, granted=160, in_use=90, quota="ai_service"),
        claim("a-1", "tenant_a", 2), claim("b-1", "tenant_b"), claim("c-1", "tenant_c")])
    quotas = quota_page.quotas(hook)
    html = render(quotas=quotas, quota_minutes=30,
                  quota_windows={m: f"?quota_minutes={m}#quotas" for m in (10, 30)},
                  quota_plots={q["quota"]: f"/quotas/{q['quota']}/plot.png" for q in quotas})
    assert [q["quota"] for q in quotas] == ["ai_service", "shared"]
    for quota, pipelines in (("ai_service", ["genai_image", "text_moderation"]),
                             ("shared", ["tenant_a", "tenant_b", "tenant_c"])):
        section = re.search(rf'<section class="quota" data-quota="{quota}">(.*?)</section>', html,
                            re.S).group(1)
        assert f"Quota <code>{quota}</code>" in section
        assert re.findall(r'<tr data-pipeline="([^"]+)">', section) == pipelines
        assert f'<img src="/quotas/{quota}/plot.png?minutes=30"' in section
    shared = re.search(r'<tr data-pipeline="tenant_a">(.*?)</tr>', html, re.S).group(1)
    assert '<td class="num fair-calls">24</td>' in shared and '<td class="num weight">2</td>' in shared
    assert "Limits:\n  320 calls at once." in html
    assert '<a href="?quota_minutes=30#quotas" class="current">30</a>' in html


def test_without_quotas_the_page_says_so() -> None:
    assert "No quota yet" in render()


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> tuple[TestClient, Tables]:
    """The quota routes on an app of their own (the gate app's login is Airflow's), reading `hook`."""
    at = [NOW - timedelta(seconds=4), NOW - timedelta(seconds=2)]
    hook = Tables([limits()], [claim("a-1", "tenant_a", 2, granted=24, in_use=20),
                               claim("b-1", "tenant_b", granted=12, in_use=12, live=False)],
                  [(at[0], "tenant_a", 20, 18), (at[0], "tenant_b", 12, 12), (at[1], "tenant_a", 24, 20)])
    monkeypatch.setattr(quota_page, "PostgresHook", lambda postgres_conn_id: hook)
    app = FastAPI()
    app.include_router(quota_page.routes("postgres_default"))
    return TestClient(app), hook


def test_the_gate_app_serves_the_quota_routes() -> None:
    assert ui.app.url_path_for("quota_plot", quota="shared") == "/quotas/shared/plot.png"
    assert "/api/quotas" in {route.path for route in ui.app.routes}


def test_the_json_route_gives_the_figures_of_each_quota(client: tuple[TestClient, Tables]) -> None:
    response = client[0].get("/api/quotas")
    assert response.status_code == 200
    (quota,) = response.json()
    assert set(quota) == {"quota", "limits", "updated_at", "granted", "in_use", "lapsed_granted", "pipelines",
                          "backlog"}
    assert (quota["quota"], quota["limits"], quota["granted"], quota["in_use"]) == (
        "shared", {"calls": 48}, {"calls": 36}, 32)
    a, b = quota["pipelines"]
    assert set(a) == {"pipeline", "lane", "weight", "holders", "demand", "granted", "in_use", "fair",
                      "lapsed"}
    assert (a["pipeline"], a["granted"], a["fair"], a["lapsed"]) == (
        "tenant_a", {"calls": 24}, {"calls": 48}, [])
    (lapsed,) = b["lapsed"]
    assert lapsed["holder"] == "b-1"
    assert datetime.fromisoformat(lapsed["released_at"]) == NOW + timedelta(seconds=59)
    assert quota["backlog"] == [{"lane": "standard", "waiting": [{"pipeline": "tenant_a",
                                                                  "waiting": {"calls": 24}}]}]


def test_the_plot_route_draws_a_png_of_the_window_asked(client: tuple[TestClient, Tables]) -> None:
    test_client, hook = client
    response = test_client.get("/quotas/shared/plot.png?minutes=30")
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    assert response.content.startswith(b"\x89PNG\r\n\x1a\n")
    assert hook.parameters[quota_page.HISTORY_SQL] == {"quota": "shared", "minutes": 30, "step": 7}
    assert test_client.get("/quotas/shared/plot.png").status_code == 200
    assert hook.parameters[quota_page.HISTORY_SQL]["minutes"] == 10
    assert test_client.get("/quotas/elsewhere/plot.png").status_code == 404
    assert test_client.get("/quotas/shared/plot.png?minutes=0").status_code == 422


def test_the_plot_draws_each_pipelines_grant_and_calls_in_use() -> None:
    at = [NOW - timedelta(seconds=4), NOW - timedelta(seconds=2)]
    hook = Tables([limits()], history=[(at[0], "tenant_a", 20, 18), (at[1], "tenant_a", 24, 20),
                                       (at[1], "tenant_b", 12, 11)])
    series = quota_page.history(hook, "shared", 10)
    assert series["tenant_a"] == {"at": at, "granted": [20, 24], "in_use": [18, 20]}
    fig = quota_page.figure("shared", 48, series, 10, NOW)
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert lines == {"tenant_a granted": [20, 24], "tenant_a in use": [18, 20], "tenant_b granted": [12],
                     "tenant_b in use": [11], "concurrency 48": [48, 48]}
