"""The Airflow UI end to end, as a person uses it: log in, trigger `pipeline_tuning` from its form
with non-default values and a pipeline picked in its dropdown, watch the run finish, read the
gate's decision (capacity, throughput, utilization with its interval, every check) on the gate
page under its pipeline's name, filter the page down to that pipeline, and roll back from it;
read a run's dead letters and endpoint circuits on the gate page, and redrive from it; start a
canary of a slower model on a live deployment from `pipeline_canary`'s form and read its rollback
on the gate page. The form's run is the LLM pipeline's (support_tickets): it also shows what the
tuning DAG measures and promotes for a pipeline other than the reference one, and the binding
limit and AI cost the gate page shows for a pipeline whose endpoints declare prices.

Airflow (standalone) runs on the test stack for this module only; Chromium is Debian's
(`make browser`), driven headless by Playwright. Screenshots go to results/ui/. The form's run
comes last: the order of the suite's two workers (tests/conftest.py) counts on it.
"""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from consumers.config import events, pipeline_spec
from consumers.config.pipeline_spec import REFERENCE
from measure import cost
from pipeline_ops.registry import ConfigRegistry
from tests.integration.canary_fixtures import PIPELINE as CANARY_PIPELINE
from tests.integration.canary_fixtures import (
    SLOWER,
    active_of,
    all_handled,
    canary_of,
    live_deployment,
    steady_load,
)
from tests.integration.conftest import stand_in_lock
from tests.integration.kafka_helpers import create_topic
from tests.integration.pipeline_fixtures import another_version, query
from tests.integration.test_dags import PASSABLE, active_version
from tests.stack import REPO, Stack, unique

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = REPO / "results" / "ui"
DAG_ID = "pipeline_tuning"
ROLLBACK_DAG_ID = "pipeline_rollback"
REDRIVE_DAG_ID = "pipeline_redrive"
PIPELINE = "support_tickets"  # not the form's default
SPEC = pipeline_spec.load(PIPELINE)
CANDIDATE = "flow"
BURST = 200  # the form's default is 320: seeing 200 in the run's conf proves the form was used
# The candidates of a pipeline other than the reference one at a time scale where its models'
# calls outlast a record's own hops and the group session (9 s) outlasts a loaded machine's
# stalls. At 0.05 text_moderation's bottleneck call took 76 ms, a trial used 0.06 to 0.2 of the
# capacity from one to the next, and members lost their partitions when the 2.25 s session ran out.
OTHER_PIPELINE_SCALE = 0.2
# The DAG tests' passable thresholds, at the time scale that another pipeline's trials need.
FORM = {"burst": BURST, **PASSABLE, "time_scale": OTHER_PIPELINE_SCALE}
# Both endpoints are held to the form's concurrency and every ticket calls both: a draft (the
# large model, 0.8 s median and 78 output tokens at 10 ms each) outlasts a triage (the small
# model, 0.4 s and a token or two at 5 ms), so the drafts' concurrency bounds the capacity.
BINDING_LIMIT = "draft.concurrency"
RUN_TIMEOUT_S = 600


class Api:
    """The REST API with a token from POST /auth/token, for what the test checks behind the UI."""

    def __init__(self, base_url: str, username: str, password: str) -> None:
        self.base_url = base_url
        resp = requests.post(f"{base_url}/auth/token", json={"username": username, "password": password},
                             timeout=30)
        resp.raise_for_status()
        self.session = requests.Session()
        # The API server shares the 2-core machine with the rest of the suite: a request it left
        # unanswered for 30 s (seen once in CI) is asked again, as its methods here are idempotent.
        retry = Retry(total=3, backoff_factor=1, allowed_methods={"GET", "PATCH", "DELETE"})
        self.session.mount("http://", HTTPAdapter(max_retries=retry))
        self.session.headers["Authorization"] = f"Bearer {resp.json()['access_token']}"

    def get(self, path: str) -> Any:
        resp = self.session.get(f"{self.base_url}{path}", timeout=30)
        resp.raise_for_status()
        return resp.json()

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        resp = self.session.patch(f"{self.base_url}{path}", json=body, timeout=30)
        resp.raise_for_status()
        return resp.json()

    def fail_unfinished(self, dag_id: str, timeout_s: float = 60) -> None:
        """Every queued or running run of the DAG marked failed, as the UI's "mark as failed" does.
        Marking one while the scheduler updates its tasks can answer 500 (the two transactions
        collide): asked again until no run is left unfinished."""
        deadline = time.monotonic() + timeout_s
        while runs := self.get(f"/api/v2/dags/{dag_id}/dagRuns?state=queued&state=running")["dag_runs"]:
            if time.monotonic() > deadline:
                pytest.fail(f"runs of {dag_id} still unfinished after {timeout_s}s: {runs}")
            for run in runs:
                resp = self.session.patch(f"{self.base_url}/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}",
                                          json={"state": "failed"}, timeout=30)
                if resp.status_code < 500:
                    resp.raise_for_status()
            time.sleep(0.5)


@pytest.fixture(scope="module")
def airflow(standalone_airflow: str) -> str:
    """The Airflow this module shares with test_triage (tests/integration/conftest.py)."""
    return standalone_airflow


@pytest.fixture(scope="module")
def password(stack: Stack, airflow: str) -> str:
    """The admin password standalone generated (or kept) in the stack's passwords file."""
    path = Path(stack.env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
    return json.loads(path.read_text())["admin"]


@pytest.fixture
def api(airflow: str, password: str) -> Api:
    return Api(airflow, "admin", password)


@contextlib.contextmanager
def paused_again(api: Api, dag_id: str) -> Iterator[None]:
    """Forms unpause a DAG on trigger: paused again afterwards when it was."""
    was_paused = api.get(f"/api/v2/dags/{dag_id}")["is_paused"]
    try:
        yield
    finally:
        if was_paused:
            api.patch(f"/api/v2/dags/{dag_id}", {"is_paused": True})


@pytest.fixture
def rollback_pause_kept(api: Api) -> Iterator[None]:
    with paused_again(api, ROLLBACK_DAG_ID):
        yield


@contextlib.contextmanager
def browser_page() -> Iterator[Any]:
    """A page of a headless Chromium of its own; a screenshot of it on failure."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        # Actions and assertions wait up to a minute: an assertion's 5 s by default is less than
        # a page's first load in a new browser on the loaded test machine (one that holds
        # returns at once).
        page.set_default_timeout(60_000)
        playwright_api.expect.set_options(timeout=60_000)
        try:
            yield page
        except BaseException:
            page.screenshot(path=SHOTS / "failure.png")
            print(f"the page at failure: {page.url}\n{shown_text(page)}")
            raise
        finally:
            browser.close()


def shown_text(page: Any, limit: int = 2000) -> str:
    """What the page shows as text, cut at `limit` characters (what a failure can say of it)."""
    try:
        return " | ".join(page.inner_text("body", timeout=5_000).split("\n"))[:limit]
    except playwright_api.Error as e:
        return f"(its text could not be read: {e.message.splitlines()[0]})"


@pytest.fixture
def page(airflow: str) -> Iterator[Any]:
    with browser_page() as page:
        yield page


def ended(api: Api, run_id: str, timeout_s: float, dag_id: str = DAG_ID) -> dict[str, Any]:
    """Poll the run until it ends, for `timeout_s` at most; the run as it is then."""
    deadline = time.monotonic() + timeout_s
    run = api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
    while run["state"] not in ("success", "failed") and time.monotonic() < deadline:
        time.sleep(1)
        run = api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
    return run


def wait_for_run(api: Api, run_id: str, timeout_s: float, dag_id: str = DAG_ID) -> dict[str, Any]:
    """Poll the run until it ends; fail with the task states when it does not succeed."""
    run = ended(api, run_id, timeout_s, dag_id)
    if run["state"] != "success":
        tasks = api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        states = {t["task_id"]: t["state"] for t in tasks}
        pytest.fail(f"run {run_id} is {run['state']} after {timeout_s:.0f}s at most; tasks: {states}")
    return run


def log_in(page: Any, airflow: str, password: str) -> None:
    """An anonymous visit lands on the login page; sign in as the admin."""
    page.goto(f"{airflow}/")
    playwright_api.expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    assert "/auth/login" in page.url
    page.screenshot(path=SHOTS / "login.png")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{airflow}/")


def trigger_from_the_form(page: Any, airflow: str, pipeline: str) -> str:
    """Fill the tuning DAG's trigger form with FORM and `pipeline` from its dropdown, submit it,
    and return the run id."""
    dialog = trigger_dialog(page, airflow, DAG_ID)
    choose(page, dialog, "pipeline", pipeline)
    # the flow preset, not the default `active`: another module may have made one of its own the
    # pipeline's active version (the canaries' live deployment does)
    choose(page, dialog, "candidate", CANDIDATE)
    for name, value in FORM.items():
        fill_number(dialog, name, value)
    playwright_api.expect(dialog.get_by_label(f"Unpause {DAG_ID} on trigger")).to_be_checked()
    dialog.get_by_role("spinbutton", name="burst", exact=True).scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / "trigger_form.png")
    return submit(page, dialog, DAG_ID)


def trigger_dialog(page: Any, airflow: str, dag_id: str) -> Any:
    """The DAG's trigger form, opened from its page. A page whose Trigger button has not shown
    within the default timeout is loaded once more, with a warning that says what it showed
    instead."""
    page.goto(f"{airflow}/dags/{dag_id}")
    trigger = page.get_by_role("button", name="Trigger").first
    try:
        trigger.wait_for()
    except playwright_api.TimeoutError:
        warnings.warn(f"no Trigger button on {page.url} after a minute; it showed: {shown_text(page)}",
                      stacklevel=2)
        page.reload()
    trigger.click()
    dialog = page.get_by_role("dialog")
    playwright_api.expect(dialog.get_by_text(f"Trigger Dag - {dag_id}")).to_be_visible()
    return dialog


def fill_number(dialog: Any, name: str, value: float) -> None:
    """Type `value` into the form's number field for the param `name`; the form keeps it."""
    field = dialog.get_by_role("spinbutton", name=name, exact=True)
    field.fill(str(value))
    field.blur()
    playwright_api.expect(field).to_have_value(str(value))


def submit(page: Any, dialog: Any, dag_id: str) -> str:
    """Submit the trigger form; the id of the run it created."""
    with page.expect_response(lambda r: r.request.method == "POST"
                              and r.url.endswith(f"/api/v2/dags/{dag_id}/dagRuns")) as posted:
        dialog.get_by_test_id("trigger-dag-submit").click()
    assert posted.value.ok, posted.value.text()
    return posted.value.json()["dag_run_id"]


def choose(page: Any, dialog: Any, name: str, value: str) -> None:
    """Pick `value` in the form's dropdown for the enum param `name` (a select with its options
    in a menu)."""
    field = dialog.locator(f"#element_{name}")
    field.scroll_into_view_if_needed()
    field.click()
    page.get_by_role("option", name=value, exact=True).click()
    playwright_api.expect(field).to_contain_text(value)


def finished_tuning(api: Api, run_id: str) -> dict[str, Any]:
    """Wait for the run; it was triggered from the form, and its gate, trials and report ran.
    Returns what the resolve task registered (version, name, pipeline, pipeline run id)."""
    run = wait_for_run(api, run_id, RUN_TIMEOUT_S)
    assert run["run_type"] == "manual"
    assert {k: run["conf"][k] for k in FORM} == FORM and run["conf"]["candidate"] == CANDIDATE
    tasks = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
    states = {t["task_id"]: t["state"] for t in tasks}
    assert {states[t] for t in ("check_pipeline", "trials", "gate", "report")} == {"success"}, states
    return api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/resolve/xcomEntries/"
                   "return_value")["value"]


def gate_frame(page: Any, airflow: str) -> Any:
    """The gate page, through its navigation entry."""
    page.goto(f"{airflow}/")
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Pipeline gate").click()
    page.wait_for_url(f"{airflow}/plugin/pipeline-gate")
    return page.frame_locator("iframe").first


# --- failures on the gate page ----------------------------------------------------------------

FAILING = "text_moderation"
# (run suffix, stage, reason, seconds after the base time, redrive round) of the dead letters
# written. Counted by pipeline, stage and reason code: moderate/ai_unavailable 4 letters in 2 runs
# (latest at +6), summarize/work_failed 2 (latest at +7), moderate/ai_bad_answer 1 (at +5). One
# ai_unavailable letter was dead-lettered in its second redrive round: at a limit of 2, it stays.
LETTERS = [("", "moderate", "ai_unavailable: http_5xx after 6 attempt(s)", 1, 0),
           ("", "moderate", "ai_unavailable: timeout after 6 attempt(s)", 2, 2),
           ("", "moderate", "ai_unavailable: http_5xx after 6 attempt(s)", 3, 0),
           ("", "summarize", "work_failed: ValueError: no summary for an empty text", 4, 0),
           ("", "moderate", "ai_bad_answer: 2xx answer is not JSON", 5, 0),
           ("-2", "moderate", "ai_unavailable: connection refused after 6 attempt(s)", 6, 0),
           ("", "summarize", "work_failed: ValueError: no summary for an empty text", 7, 0)]
# (stage, state, detail, seconds after the base time) of the circuit transitions written:
# moderate's circuit opened twice and is open since +3, summarize's opened once and is closed since +4.
TRANSITIONS = [("moderate", "open", "http_5xx from 5 requests in 10 s", 1),
               ("moderate", "half_open", "probe", 2),
               ("moderate", "open", "probe failed: http_5xx", 3),
               ("summarize", "open", "timeouts from 4 requests in 10 s", 1),
               ("summarize", "half_open", "probe", 2),
               ("summarize", "closed", "probe answered", 4)]


def failures_of(stack: Stack, run: str, base: datetime) -> dict[int, int]:
    """Dead letters (with the record's key and value) and circuit transitions of `run` (and of
    `run`-2) as the runtime writes them, and the source topics of the letters; returns the id of
    each letter by its index in LETTERS."""
    spec = pipeline_spec.load(FAILING)
    sources = {events.Topics(run + suffix, spec).source_of(stage) for suffix, stage, *_ in LETTERS}
    for topic in sources:
        create_topic(stack.connection, topic)
    ids = {}
    with contextlib.closing(psycopg2.connect(stack.database_url)) as conn, conn, conn.cursor() as cur:
        for n, (suffix, stage, reason, second, round_) in enumerate(LETTERS):
            key = unique("message")
            cur.execute("INSERT INTO dead_letters (pipeline, run_id, request_id, stage, reason, "
                        "source_topic, kafka_partition, kafka_offset, payload, kafka_key, redrive, at) "
                        "VALUES (%s, %s, %s, %s, %s, %s, 0, %s, %s, %s, %s, %s) RETURNING id",
                        (FAILING, run + suffix, key, stage, reason,
                         events.Topics(run + suffix, spec).source_of(stage), n,
                         json.dumps({"message_id": key, "text": "a post"}).encode(), key.encode(), round_,
                         base + timedelta(seconds=second)))
            ids[n] = cur.fetchone()[0]
        for stage, state, detail, second in TRANSITIONS:
            cur.execute("INSERT INTO endpoint_circuits (run_id, stage, endpoint, state, detail, at) "
                        "VALUES (%s, %s, %s, %s, %s, %s)",
                        (run, stage, stage, state, detail, base + timedelta(seconds=second)))
    return ids


def wait_for_dag(api: Api, dag_id: str, timeout_s: float) -> None:
    """Until the DAG processor has parsed the DAG and the API knows it."""
    deadline = time.monotonic() + timeout_s
    while api.session.get(f"{api.base_url}/api/v2/dags/{dag_id}", timeout=30).status_code == 404:
        if time.monotonic() > deadline:
            pytest.fail(f"Airflow does not know {dag_id} after {timeout_s:.0f}s (dags/{dag_id}.py missing?)")
        time.sleep(2)


def shown(when: datetime) -> str:
    """A time as the gate page shows it (UTC)."""
    return when.strftime("%Y-%m-%d %H:%M:%S")


def redrive_from_the_page(page: Any, gate: Any, api: Api) -> tuple[dict[str, Any], dict[str, Any]]:
    """Submit the gate page's Redrive form as it is filled; the run it triggered, once finished,
    and its summary."""
    with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith(
            f"/api/v2/dags/{REDRIVE_DAG_ID}/dagRuns")) as posted:
        gate.locator("#redrive-button").click()
    assert posted.value.ok, posted.value.text()
    run_id = posted.value.json()["dag_run_id"]
    playwright_api.expect(gate.locator("#redrive-status")).to_contain_text(f"Redrive triggered: run {run_id}")
    run = wait_for_run(api, run_id, 300, REDRIVE_DAG_ID)
    summary = api.get(f"/api/v2/dags/{REDRIVE_DAG_ID}/dagRuns/{run_id}/taskInstances/redrive/xcomEntries/"
                      "return_value")["value"]
    return run, summary


@pytest.mark.timeout(900)
def test_dead_letters_and_circuits_on_the_gate_page_and_a_redrive_from_it(stack: Stack, airflow: str,
                                                                          password: str, api: Api,
                                                                          page: Any) -> None:
    """A run's dead letters and circuit transitions (written here as the runtime writes them): the
    gate page counts the letters by pipeline, stage and reason, largest or latest first, shows
    each endpoint's circuit, and its Redrive form, filled from a row, triggers `pipeline_redrive`
    with the user's login and the conf chosen in it: the letters go back, once, within the limit
    of redrives, and the page counts them as sent back."""
    expect = playwright_api.expect
    run = unique("ui-failures")
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    letter_ids = failures_of(stack, run, base)
    wait_for_dag(api, REDRIVE_DAG_ID, 180)
    try:
        log_in(page, airflow, password)
        gate = gate_frame(page, airflow)

        # The run's dead letters (the run id is a prefix of the second run's), largest group first.
        chosen = gate.locator("#dead-letter-filter")
        chosen.locator('input[name="run"]').fill(run)
        chosen.locator('select[name="letters_by"]').select_option("count")
        chosen.get_by_role("button", name="Show").click()
        rows = gate.locator("#dead-letters-table tbody tr")
        groups = [("moderate", "ai_unavailable", 4, 2, 6), ("summarize", "work_failed", 2, 1, 7),
                  ("moderate", "ai_bad_answer", 1, 1, 5)]
        expect(rows).to_have_count(len(groups))
        for row, (stage, reason, letters, runs, latest) in zip(rows.all(), groups, strict=True):
            expect(row).to_have_attribute("data-pipeline", FAILING)
            expect(row).to_have_attribute("data-stage", stage)
            expect(row).to_have_attribute("data-reason", reason)
            expect(row.locator("td.letters")).to_have_text(str(letters))
            expect(row.locator("td.runs")).to_have_text(str(runs))
            expect(row.locator("td.latest")).to_have_text(shown(base + timedelta(seconds=latest)))
            expect(row.locator("td.sent-back")).to_have_text("0")
        page.set_viewport_size({"width": 1400, "height": 1500})
        page.screenshot(path=SHOTS / "gate_dead_letters.png")
        # Latest first.
        chosen.locator('select[name="letters_by"]').select_option("latest")
        chosen.get_by_role("button", name="Show").click()
        expect(rows.first).to_have_attribute("data-reason", "work_failed")
        assert [r.get_attribute("data-reason") for r in rows.all()] == [
            "work_failed", "ai_unavailable", "ai_bad_answer"]

        # Each endpoint's circuit: the open one first, since its latest transition.
        circuits = gate.locator("#circuits-table tbody tr")
        expect(circuits).to_have_count(2)
        for circuit, (stage, state, since, openings, detail) in zip(circuits.all(), [
                ("moderate", "open", 3, 2, "probe failed: http_5xx"),
                ("summarize", "closed", 4, 1, "probe answered")], strict=True):
            expect(circuit).to_have_attribute("data-run-id", run)
            expect(circuit).to_have_attribute("data-stage", stage)
            expect(circuit.locator("td.state")).to_have_text(state)
            expect(circuit.locator("td.since")).to_have_text(shown(base + timedelta(seconds=since)))
            expect(circuit.locator("td.openings")).to_have_text(str(openings))
            expect(circuit.locator("td.detail")).to_have_text(detail)

        # Redrive the endpoint's letters: the row fills the form, the DAG's params its defaults.
        form = gate.locator("#redrive-form")
        gate.locator('#dead-letters-table tr[data-reason="ai_unavailable"] button.redrive-select').click()
        for name, value in (("pipeline", FAILING), ("run", run), ("stages", "moderate"),
                            ("reasons", "ai_unavailable"), ("since", ""), ("until", "")):
            expect(form.locator(f'input[name="{name}"]')).to_have_value(value)
        expect(gate.locator("#redrive-button")).to_be_enabled()
        params = api.get(f"/api/v2/dags/{REDRIVE_DAG_ID}/details")["params"]
        for name in ("limit", "rate", "max_redrives"):
            assert float(form.locator(f'input[name="{name}"]').input_value()) == params[name]["value"]
        since = base.isoformat().replace("+00:00", "Z")
        chosen_conf = {"pipeline": FAILING, "run": run, "stages": ["moderate"], "reasons": ["ai_unavailable"],
                       "since": since, "until": "", "limit": 10, "rate": 50, "max_redrives": 2}
        for name in ("since", "limit", "rate", "max_redrives"):
            form.locator(f'input[name="{name}"]').fill(str(chosen_conf[name]))
        page.screenshot(path=SHOTS / "gate_redrive_form.png")
        with paused_again(api, REDRIVE_DAG_ID):
            # Three of the four letters go back; the one in its second round is at the limit.
            first, summary = redrive_from_the_page(page, gate, api)
            assert first["conf"] == chosen_conf
            assert (first["run_type"], first["triggering_user_name"]) == ("manual", "admin")
            assert summary == {"batch": first["dag_run_id"], "requested_by": "admin", "selected": 4,
                               "redriven": 3, "skipped_done": 0, "skipped_limit": 1, "skipped_reference": 0}
            # The same selection again sends nothing.
            second, summary = redrive_from_the_page(page, gate, api)
            assert second["conf"] == chosen_conf and second["dag_run_id"] != first["dag_run_id"]
            assert summary["selected"] == summary["redriven"] == 0, summary
        page.screenshot(path=SHOTS / "gate_redrive_triggered.png")

        # Who asked is kept with each letter considered; the page counts the letters sent back.
        with contextlib.closing(psycopg2.connect(stack.database_url)) as conn, conn.cursor() as cur:
            cur.execute("SELECT dead_letter_id, outcome, requested_by, batch, sent_at IS NOT NULL "
                        "FROM redrives WHERE dead_letter_id = ANY(%s)", (list(letter_ids.values()),))
            considered = cur.fetchall()
        redriven = {letter_ids[n] for n in (0, 2, 5)}
        assert sorted(considered) == sorted(
            [(i, "redriven", "admin", first["dag_run_id"], True) for i in redriven]
            + [(letter_ids[1], "skipped_limit", "admin", first["dag_run_id"], False)])
        chosen.get_by_role("button", name="Show").click()
        for reason, sent_back in (("ai_unavailable", "3"), ("work_failed", "0"), ("ai_bad_answer", "0")):
            cell = gate.locator(f'#dead-letters-table tr[data-reason="{reason}"] td.sent-back')
            expect(cell).to_have_text(sent_back)
        page.screenshot(path=SHOTS / "gate_redriven.png")
    except BaseException:
        page.screenshot(path=SHOTS / "failure.png")
        raise


# --- a canary from its form ------------------------------------------------------------------

CANARY_DAG_ID = "pipeline_canary"
# The canary's form as a person fills it in: the live deployment's run id, the slower model as the
# overrides (in the form's JSON editor), a window the test's steady load fills; steps as defaulted.
CANARY_WINDOW_S = 12


def fill_json(page: Any, dialog: Any, name: str, value: object) -> None:
    """Replace the text of the form's JSON editor for the param `name` with `value`, pasted as a
    person would paste it (typed, the editor would close each bracket and quote once more)."""
    editor = dialog.locator(f"#element_{name}")
    editor.scroll_into_view_if_needed()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.evaluate("text => navigator.clipboard.writeText(text)", json.dumps(value))
    editor.locator(".view-lines").click()
    page.keyboard.press("ControlOrMeta+A")
    page.keyboard.press("ControlOrMeta+V")
    # the form takes it and shows it indented again
    playwright_api.expect(editor).to_contain_text(json.dumps(value, indent=2).split("\n")[1].strip())
    playwright_api.expect(dialog.get_by_text("SyntaxError")).to_have_count(0)


def trigger_canary_from_the_form(page: Any, airflow: str, run_id: str) -> str:
    """Fill the canary DAG's form for a slower draft model on the live run, submit it; the run id."""
    dialog = trigger_dialog(page, airflow, CANARY_DAG_ID)
    choose(page, dialog, "pipeline", CANARY_PIPELINE)
    dialog.locator("#element_run_id").fill(run_id)
    fill_json(page, dialog, "overrides", SLOWER)
    fill_number(dialog, "window_s", CANARY_WINDOW_S)
    page.screenshot(path=SHOTS / "canary_form.png")
    return submit(page, dialog, CANARY_DAG_ID)


@pytest.mark.timeout(900)
def test_a_canary_from_its_form_to_its_rollback_on_the_gate_page(stack: Stack, airflow: str, password: str,
                                                                 api: Api, page: Any) -> None:
    """A person starts a canary of a slower, dearer draft model on a live deployment from the
    canary DAG's form, and reads on the gate page that it rolled back by itself at its first
    step: the step's verdict, each check's outcome, the cost per request failed with the
    candidate's figure beside the baseline's, the plot; the live version stays active and every
    ticket is handled."""
    expect = playwright_api.expect
    wait_for_dag(api, CANARY_DAG_ID, 180)
    with stand_in_lock(stack), live_deployment(stack) as live, paused_again(api, CANARY_DAG_ID):
        log_in(page, airflow, password)
        with steady_load(stack, live) as sent:
            run_id = trigger_canary_from_the_form(page, airflow, live.run_id)
            run = wait_for_run(api, run_id, 600, CANARY_DAG_ID)
        assert run["conf"]["run_id"] == live.run_id and run["conf"]["overrides"] == SLOWER
        assert run["conf"]["window_s"] == CANARY_WINDOW_S
        canary, state, steps = canary_of(stack, live)
        assert (state, steps) == ("rolled_back", [(1, "fail")])
        assert active_of(stack) == [(live.version,)]

        gate = gate_frame(page, airflow)
        section = gate.locator(f'section.canary[data-canary="{canary}"]')
        expect(section).to_be_visible()
        expect(section.locator("h3 .badge")).to_have_text("rolled back")
        step = section.locator('.canary-step[data-step="1"]')
        expect(step.locator("h4 .badge")).to_have_text("fail")
        listed = next(c for c in api.get("/pipeline-gate/api/canaries") if c["id"] == canary)
        checks = {k["name"]: k for k in listed["steps"][0]["checks"]}
        # the dearer model's cost fails whatever this machine's load does to the latencies
        spent = checks["cost_per_request"]
        assert spent["outcome"] == "fail" and spent["measured"] > 1.3 * spent["baseline"], spent
        for name, check in checks.items():
            row = step.locator(f'tr[data-check="{name}"]')
            expect(row.locator("td.outcome .badge")).to_have_text(check["outcome"])
        expect(step.locator('tr[data-check="cost_per_request"] td.p-value')).not_to_have_text("–")
        plot = section.locator("img").first
        expect(plot).to_be_visible()
        # drawn from the canary's rows when asked: its width once it has loaded (0 if it failed)
        width = plot.evaluate("img => img.complete ? img.naturalWidth : new Promise(done => {"
                              "img.onload = () => done(img.naturalWidth); img.onerror = () => done(0); })")
        assert width > 0, "the canary's plot did not load"
        section.scroll_into_view_if_needed()
        page.screenshot(path=SHOTS / "gate_canary.png")
        all_handled(stack, live, sent)


# --- the form's tuning run ------------------------------------------------------------------

@dataclass(frozen=True)
class FormRun:
    """The tuning run triggered from the form, and what the registry said just around it."""

    run_id: str
    elsewhere: str  # a decision of the reference pipeline, recorded just before the run's
    reference_active: tuple[int, int | None]  # the reference pipeline's, before and after
    active_after: int | None  # the run's pipeline's active version just after it


@pytest.fixture(scope="module")
def form_run(stack: Stack, airflow: str, password: str) -> FormRun:
    """One tuning run (the slowest thing here), triggered from the DAG's form with another
    pipeline than the default picked in its dropdown, a non-default burst and a gate the loaded
    test machine passes, alone on the stack's AI stand-in and Spark master: it serves both the
    walk on the gate page and the checks of what the run measured."""
    api = Api(airflow, "admin", password)
    # A run an earlier session left unfinished is failed first: the DAG runs one at a time, and
    # unpaused, that one would go first.
    api.fail_unfinished(DAG_ID)
    with stand_in_lock(stack), paused_again(api, DAG_ID), browser_page() as page:
        elsewhere = decision_of_another_pipeline(stack)  # before the run's: the page's plots are the latest's
        reference_before = reference_active(stack)
        log_in(page, airflow, password)
        run_id = trigger_from_the_form(page, airflow, PIPELINE)
        # It is queued until the scheduler's executor picks it up; the tests check how it ended.
        ended(api, run_id, RUN_TIMEOUT_S)
        return FormRun(run_id, elsewhere, (reference_before, active_version(stack)),
                       active_version(stack, PIPELINE))


@pytest.mark.timeout(RUN_TIMEOUT_S + 900)
def test_the_form_s_run_measures_and_promotes_the_pipeline_picked(stack: Stack, api: Api,
                                                                   form_run: FormRun) -> None:
    """The run measured the picked pipeline's own topics and stages, compared it with that
    pipeline's history alone, and promoted its candidate for that pipeline alone."""
    resolved = finished_tuning(api, form_run.run_id)
    rows = query(stack.database_url, "SELECT d.candidate, c.name, c.pipeline, d.passed, d.reasons, "
                 "d.figures, d.active_before FROM gate_decisions d JOIN configurations c "
                 "ON c.version = d.candidate WHERE d.run_id = %s", resolved["run_id"])
    assert len(rows) == 1, rows
    version, name, pipeline, passed, reasons, figures, active_before = rows[0]
    assert (version, name, pipeline, passed) == (resolved["version"], "flow", PIPELINE, True), reasons
    # the active version it was decided against and compared with, if any, is the picked
    # pipeline's (the reference pipeline has one of its own)
    for other in filter(None, (active_before, (figures["reference"] or {}).get("version"))):
        assert query(stack.database_url, "SELECT pipeline FROM configurations WHERE version = %s",
                     other) == [(PIPELINE,)]
    assert len(figures["trials"]) == FORM["trials"]
    for trial in figures["trials"]:
        assert trial["produced"] == trial["completed"] == BURST
        assert trial["binding_limit"] == BINDING_LIMIT
        skew = query(stack.database_url, "SELECT records, diagnosis FROM analysis_skew WHERE topic = %s",
                     f"{trial['run_id']}.tickets")  # support_tickets' measured topic
        assert skew and skew[0][0] == BURST, skew
        # uuid keys: whatever the burst hashed to, nothing to fix; the gate's figures carry it
        assert skew[0][1] in ("balanced", "hashing_noise") and trial["skew_diagnosis"] == skew[0][1]
        # a trial's load has no spam: every ticket is triaged, then drafted (the completing stage)
        stages = query(stack.database_url, "SELECT stage, count(*) FROM stage_results WHERE run_id = %s "
                       "GROUP BY stage ORDER BY stage", trial["run_id"])
        assert stages == [("draft", BURST), ("triage", BURST)]
    # The cost: every call's tokens at its endpoint's declared prices (no gateway on this stack),
    # none paid twice, over the trials' completed tickets.
    spent = figures["summary"]["cost"]
    assert spent["cost_per_1k_requests"] == pytest.approx(
        declared_cost_per_1k(stack, [t["run_id"] for t in figures["trials"]]), rel=1e-9)
    assert spent["cost_per_1k_requests"] > 0 and spent["paid_twice_cost"] == 0
    assert form_run.active_after == version
    before, after = form_run.reference_active
    assert after == before  # each pipeline keeps its own active version


@pytest.mark.timeout(RUN_TIMEOUT_S + 900)
def test_trigger_tuning_from_the_form_and_act_on_the_gate_decision(stack: Stack, airflow: str, password: str,
                                                                    api: Api, form_run: FormRun,
                                                                    rollback_pause_kept: None,
                                                                    page: Any) -> None:
    """The form's run as a person follows it (the form's default pipeline is checked at parse
    time): the run, the decision on the gate page under its pipeline's name, the page's filter,
    and a rollback from it."""
    expect = playwright_api.expect
    run_id, elsewhere = form_run.run_id, form_run.elsewhere
    resolved = finished_tuning(api, run_id)
    assert api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["conf"]["pipeline"] == PIPELINE
    assert resolved["pipeline"] == PIPELINE and resolved["config"]["pipeline"] == PIPELINE
    pipeline_run = resolved["run_id"]

    try:
        log_in(page, airflow, password)
        page.goto(f"{airflow}/dags/{DAG_ID}/runs/{run_id}")
        expect(page.get_by_text(run_id).first).to_be_visible()
        expect(page.get_by_text("success", exact=False).first).to_be_visible()
        page.screenshot(path=SHOTS / "run_finished.png")

        # The gate page, through its navigation entry, shows this run's decision and its checks.
        decision = api.get(f"/pipeline-gate/api/decisions?run_id={pipeline_run}")
        assert len(decision) == 1, decision
        decision = decision[0]
        assert (decision["version"], decision["pipeline"]) == (resolved["version"], PIPELINE)
        assert decision["thresholds"]["target_utilization"] == FORM["target_utilization"]
        assert decision["passed"], decision["reasons"]
        summary = decision["figures"]["summary"]
        assert summary["trials"] == FORM["trials"]
        gate = gate_frame(page, airflow)
        row = gate.locator(f'tr[data-run-id="{pipeline_run}"]')
        expect(row).to_be_visible()
        expect(row.locator("td.pipeline")).to_have_text(PIPELINE)
        expect(row).to_contain_text(f"v{decision['version']} ({decision['name']})")
        expect(row).to_contain_text("passed")
        for check in decision["reasons"]:
            expect(row).to_contain_text(check["name"])
            expect(row).to_contain_text(check["required"])
        utilization = summary["utilization"]
        expect(row.locator("td.utilization")).to_contain_text(
            f"{utilization['estimate']:.3f} [{utilization['low']:.3f}, {utilization['high']:.3f}]")
        expect(row.locator("td.capacity")).to_contain_text(f"{summary['capacity_rps']['estimate']:.1f}")
        # What bound the capacity, and what the calls cost (per 1,000 tickets, none paid twice).
        assert summary["binding_limits"] == [BINDING_LIMIT]
        expect(row.locator("td.capacity .binding")).to_have_text(f"bound by {BINDING_LIMIT}")
        spent = summary["cost"]
        assert spent["cost_per_1k_requests"] > 0 and spent["paid_twice_cost"] == 0
        expect(row.locator("td.cost")).to_contain_text(
            f"{cost.shown(spent['cost_per_1k_requests'])} per 1,000 requests")
        expect(row.locator("td.cost .failed-cost")).to_contain_text("paid twice 0")
        expect(row.locator("td.throughput")).to_contain_text(
            f"{summary['steady_throughput_rps']['estimate']:.2f}")
        # Each trial's skew and why: uuid keys (the flow preset's) leave nothing to fix.
        for trial in decision["figures"]["trials"]:
            assert trial["skew_diagnosis"] in ("balanced", "hashing_noise"), trial
            skew = row.locator(f'tr[data-trial="{trial["run_id"]}"]')
            expect(skew.locator("td.diagnosis")).to_have_text(trial["skew_diagnosis"])
            expect(skew.locator("td.max-over-mean")).to_have_text(str(trial["skew_max_over_mean"]))
            expect(skew.locator("td.recommendation")).to_have_text(trial["skew_recommendation"])
        expect(gate.locator(f'#active-version li[data-pipeline="{PIPELINE}"]')).to_contain_text(
            f"v{decision['version']}")
        for plot in ("completions.png", "requests_per_partition.png"):
            image = gate.locator(f'img[alt="{plot}"]')
            expect(image).to_be_visible()
            assert image.evaluate("img => img.complete && img.naturalWidth > 0"), f"{plot} did not load"
        page.set_viewport_size({"width": 1400, "height": 1500})
        page.screenshot(path=SHOTS / "gate_page.png")

        # The filter down to the pipeline: only its decisions (rows that are decisions, not the
        # rows of their tables of checks); the other pipeline's was listed before.
        decisions = api.get(f"/pipeline-gate/api/decisions?pipeline={PIPELINE}&limit=500")
        assert pipeline_run in {d["run_id"] for d in decisions}
        assert {d["pipeline"] for d in decisions} == {PIPELINE}
        expect(gate.locator(f'tr[data-run-id="{elsewhere}"] td.pipeline')).to_have_text(REFERENCE)
        gate.locator("#pipeline-filter").get_by_role("link", name=PIPELINE, exact=True).click()
        expect(row).to_be_visible()
        expect(gate.locator(f'tr[data-run-id="{elsewhere}"]')).to_have_count(0)
        expect(gate.locator("#decisions > tbody > tr").first).to_have_attribute("data-pipeline", PIPELINE)
        expect(gate.locator(f'#decisions > tbody > tr:not([data-pipeline="{PIPELINE}"])')).to_have_count(0)
        page.screenshot(path=SHOTS / "gate_page_filtered.png")

        # Roll back from the gate page to another version, then back with "the previous one".
        other = another_version(stack.database_url, PIPELINE)
        page.reload()  # the form lists the versions registered when the page was rendered
        gate = page.frame_locator("iframe").first
        for target, reason in ((other, "ui test: away"), (0, "ui test: back")):
            with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith(
                    f"/api/v2/dags/{ROLLBACK_DAG_ID}/dagRuns")) as posted:
                rollback(gate, target, reason, PIPELINE)
            assert posted.value.ok, posted.value.text()
            expect(gate.locator("#rollback-status")).to_contain_text("Rollback triggered")
            wait_for_run(api, posted.value.json()["dag_run_id"], 300, ROLLBACK_DAG_ID)
            expected, previous = (other, decision["version"]) if target else (decision["version"], other)
            assert query(stack.database_url, "SELECT p.version, p.previous, p.action, p.reason "
                         "FROM promotions p JOIN configurations c USING (version) WHERE c.pipeline = %s "
                         "ORDER BY p.id DESC LIMIT 1", PIPELINE) == [(expected, previous, "rollback", reason)]
            page.reload()
            gate = page.frame_locator("iframe").first
            expect(gate.locator(f'#active-version li[data-pipeline="{PIPELINE}"]')).to_contain_text(
                f"v{expected}")
            expect(gate.locator("#promotions tbody tr").first).to_contain_text(reason)
        page.screenshot(path=SHOTS / "gate_rolled_back.png")
    except BaseException:
        page.screenshot(path=SHOTS / "failure.png")
        raise


def declared_cost_per_1k(stack: Stack, run_ids: list[str]) -> float:
    """What the runs' calls cost per 1,000 completed requests, from their answered calls' tokens
    at the prices the spec declares for each stage's endpoint; every ticket was called once per
    stage (checked here, so no other billed call is left out)."""
    prices = {"triage": SPEC.endpoints["small_model"].price, "draft": SPEC.endpoints["large_model"].price}
    rows = query(stack.database_url, "SELECT stage, count(*), sum(tokens_input), sum(tokens_output) "
                 "FROM ai_attempts WHERE run_id = ANY(%s) AND outcome = 'ok' GROUP BY stage", run_ids)
    completed = len(run_ids) * BURST
    assert {(stage, calls) for stage, calls, *_ in rows} == {("triage", completed), ("draft", completed)}
    total = sum(tokens_in / 1000 * prices[stage].input_per_1k
                + tokens_out / 1000 * prices[stage].output_per_1k for stage, _, tokens_in, tokens_out in rows)
    return 1000 * total / completed


def reference_active(stack: Stack) -> int:
    """The reference pipeline's active version, for a run of another pipeline to leave alone
    (one is activated here when none is)."""
    version = active_version(stack)
    if version is None:
        version = another_version(stack.database_url, REFERENCE)
        ConfigRegistry().activate(version, "promote", reason="the UI test's reference version")
    return version


def decision_of_another_pipeline(stack: Stack) -> str:
    """A gate decision of the reference pipeline (a rejection with no figures), so the page has
    two pipelines to filter; returns its run id."""
    version = another_version(stack.database_url, REFERENCE)
    run_id = unique("ui-filter")
    query(stack.database_url, "INSERT INTO gate_decisions (run_id, candidate, passed, reasons, figures, "
          "thresholds) VALUES (%s, %s, false, '[]', '{}', '{}') RETURNING id", run_id, version)
    return run_id


def rollback(gate: Any, version: int, reason: str, pipeline: str) -> None:
    """Fill in and submit the gate page's rollback form (version 0: the one active before)."""
    gate.locator('#rollback-form select[name="target"]').select_option(f"{pipeline}:{version}")
    gate.locator('#rollback-form input[name="reason"]').fill(reason)
    gate.locator("#rollback-button").click()
