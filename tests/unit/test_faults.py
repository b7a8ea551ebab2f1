"""The fault-injection harness's own logic, on hand-built inputs (no services)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench import fault_pipeline
from bench.fault_figures import (
    Poison,
    exited_fleets,
    longest_stall_s,
    notification_outcomes,
    poison_outcomes,
    rate_between,
    reason_code,
    reasons_by_code,
    recovery_s,
    request_of,
    unexpected_dead_letters,
    verdict,
)
from bench.fault_fleets import holdings
from bench.fault_injection import (
    FAULTS,
    OVERSIZE_BYTES,
    FleetKill,
    busiest_leader,
    hang_s,
    in_flight_window,
    oversize_records,
)
from bench.fault_record import FaultRun, Injection, Load, PhaseFigures, PhaseRecord, PoisonOutcomes
from bench.fault_report import plot
from bench.faults import Settings
from consumers.config import events, pipeline_spec
from consumers.config.candidate import PipelineConfig, StageConfig


def completions() -> list[float]:
    """10/s for 20 s, nothing during a fault from 20 to 30 s, 4/s from 30 to 33 s, 10/s to 50 s."""
    before = [i / 10 for i in range(200)]
    slow = [30 + i * 0.25 for i in range(12)]
    after = [33 + i / 10 for i in range(170)]
    return before + slow + after


def test_rate_between_counts_the_half_open_window() -> None:
    assert rate_between([0.0, 0.5, 1.0, 1.5, 2.0], 0.0, 2.0) == 2.0  # 4 completions in 2 s
    assert rate_between([1.0], 2.0, 2.0) == 0.0


def test_recovery_is_the_first_second_whose_window_reaches_90_percent() -> None:
    # pre-fault: 100 completions in [10, 20) = 10/s, threshold 9/s over 5 s windows.
    # [30, 35): 12 + 20 = 32 -> 6.4/s; [31, 36): 8 + 30 -> 7.6/s; [32, 37): 4 + 40 -> 8.8/s;
    # [33, 38): 50 -> 10/s: recovered 3 s after the fault's end.
    assert recovery_s(completions(), 20.0, 30.0, 50.0, baseline_s=10.0, window_s=5.0) == (10.0, 3)


def test_recovery_not_reached_before_the_load_ends() -> None:
    # Only windows ending by 36 s fit: [30, 35) and [31, 36), both below 9/s.
    assert recovery_s(completions(), 20.0, 30.0, 36.0, baseline_s=10.0, window_s=5.0) == (10.0, None)


def test_recovery_without_a_pre_fault_rate_is_unknown() -> None:
    assert recovery_s([25.0, 26.0], 20.0, 21.0, 40.0, baseline_s=10.0, window_s=5.0) == (0.0, None)


def test_longest_stall_counts_from_the_fault_start_to_the_load_end() -> None:
    assert longest_stall_s([1.0, 2.0, 5.0, 6.0], 0.0, 7.0) == 3.0  # 2 -> 5
    assert longest_stall_s([-4.0, 0.5, 9.0], 0.0, 4.0) == 3.5  # 0.5 -> the load's end at 4
    assert longest_stall_s([], 10.0, 12.5) == 2.5


def test_a_resent_final_message_is_not_a_duplicate_result_but_a_different_one_is() -> None:
    notes = [
        {"request_id": "r1", "run_id": "x", "kind": "result", "url": "A", "at": 1.0},
        {"request_id": "r1", "run_id": "x", "kind": "result", "url": "A", "at": 2.0},  # resent
        {"request_id": "r2", "run_id": "x", "kind": "result", "url": "B", "at": 1.0},
        {"request_id": "r2", "run_id": "x", "kind": "failed", "reason": "ai_unavailable", "at": 3.0},
        {"request_id": "r3", "run_id": "x", "kind": "choose_style", "user_id": "u", "at": 1.0},
        {"request_id": "r3", "run_id": "x", "kind": "rejected", "verdict": "rejected", "at": 2.0},
    ]
    assert notification_outcomes(notes) == ({"r2"}, 1)


def test_reason_code_is_the_text_before_the_colon() -> None:
    assert reason_code("oversize: 1010000 bytes > 65536") == "oversize"
    assert reason_code("ai_unavailable: timeout from http://x after 6 attempt(s)") == "ai_unavailable"
    rows = [("ai_unavailable: http_5xx from /v1/check", 2), ("ai_unavailable: timeout", 1),
            ("oversize: 1010000 bytes", 1)]
    assert reasons_by_code(rows) == {"ai_unavailable": 3, "oversize": 1}


def test_unexpected_dead_letters_take_the_larger_of_table_and_topic() -> None:
    rows = {"oversize": 2}
    topic = {"oversize": 3, "database_unavailable": 1}
    assert unexpected_dead_letters(rows, topic, {"oversize": 3}) == 1  # the database one
    assert unexpected_dead_letters({"oversize": 5}, {}, {"oversize": 3}) == 2
    assert unexpected_dead_letters({"ai_unavailable": 7}, {}, {"ai_unavailable": None}) == 0


def measured(**changes: Any) -> PhaseFigures:
    """A clean phase's figures: 16 calls served twice by the service's count and by our rows,
    recovered 11 s after the fault's end."""
    clean = PhaseFigures(
        completed=845, status={"completed": 845}, dead_letters={"table": {}, "topic": {}},
        unexpected_dead_letters=0, lost=0, injected_lost=[], intake_unrecorded=0, duplicate_results=0,
        resent_notifications=0, outputs_read_committed={}, duplicate_outputs=0, duplicate_ai_calls=16,
        service={}, service_duplicates=16, service_hangs=0, uncommitted={"check": 0, "generate": 0},
        pre_fault_rps=18.0, fault_rps=None, longest_stall_s=2.0, recovery_s=11, steady_throughput_rps=18.5,
        rebalances=1, p99_ms=2500.0, completions_per_second=[18, 0, 21])
    return replace(clean, **changes)


def phase(**changes: Any) -> PhaseRecord:
    """A phase of a fault that allows the 16 calls served twice, measured clean unless changed."""
    clean = PhaseRecord(fault="fleet-kill-generate", summary="kill -9", allowed_dead_letters={},
                        max_recovery_s=None, fleets_stay_up=False, pipeline="genai_image", run_id="faults-x",
                        allowed_service_duplicates=16, exactly_once=False, figures=measured())
    return replace(clean, **changes)


def test_verdict_lists_every_breach() -> None:
    assert verdict(phase()) == []
    assert verdict(phase(allowed_service_duplicates=0)) == ["16 AI calls served twice (allowed 0)"]
    broken = phase(allowed_service_duplicates=0, error="TimeoutError: x", figures=measured(
        lost=2, duplicate_results=1, duplicate_ai_calls=0, service_duplicates=0, unexpected_dead_letters=4,
        uncommitted={"check": 0, "generate": 3}))
    assert verdict(broken) == ["not measured: TimeoutError: x", "2 lost", "1 duplicate results",
                               "4 dead letters for a reason not injected",
                               "3 records uncommitted after the run"]


def test_verdict_fails_outputs_seen_twice_only_when_the_phase_ran_exactly_once() -> None:
    twice = phase(figures=measured(duplicate_outputs=3))
    assert verdict(twice) == []  # at least once: a resent output is the documented behaviour
    assert verdict(replace(twice, exactly_once=True)) == [
        "3 output events seen twice by a read_committed reader"]


def test_verdict_holds_every_faults_duplicate_calls_to_the_services_count() -> None:
    assert verdict(phase(figures=measured(duplicate_ai_calls=19))) == [
        "19 duplicate AI calls by our rows, 16 by the service"]
    assert verdict(phase(figures=measured(duplicate_ai_calls=13))) == [
        "13 duplicate AI calls by our rows, 16 by the service"]


def test_verdict_allows_one_more_paid_call_per_hang_past_the_timeout() -> None:
    assert verdict(phase(allowed_service_duplicates=0, figures=measured(service_hangs=16))) == []
    assert verdict(phase(allowed_service_duplicates=0, figures=measured(service_hangs=15))) == [
        "16 AI calls served twice (allowed 15)"]


def test_verdict_holds_the_recovery_to_the_fault_bound() -> None:
    # the phase recovered 11 s after the fault's end: no bound, or one of 11 s, passes; 10 s fails.
    assert verdict(phase(max_recovery_s=None)) == []
    assert verdict(phase(max_recovery_s=11.0)) == []
    assert verdict(phase(max_recovery_s=10.0)) == ["recovery 11 s (bound 10 s)"]
    assert verdict(phase(max_recovery_s=10.0, figures=measured(recovery_s=None))) == [
        "not back to 90% of the pre-fault rate within the load"]
    # a phase that could not be measured has no recovery figure: only the error is reported
    unmeasured = phase(error="TimeoutError: x", allowed_service_duplicates=0, max_recovery_s=10.0,
                       figures=None)
    assert verdict(unmeasured) == ["not measured: TimeoutError: x"]


def test_verdict_fails_a_fleet_that_exited_only_when_the_fault_says_it_must_not() -> None:
    pids = {"intake": {"start": 100, "end": 100}, "generate": {"start": 200, "end": 230},
            "check": {"start": 300, "end": 0}}
    assert exited_fleets(pids) == ["generate", "check"]
    assert verdict(phase(fleet_pids=pids)) == []  # a fleet kill restarts one by design
    assert verdict(phase(fleet_pids=pids, fleets_stay_up=True)) == [
        "fleet generate exited (pid 200 at the start, 230 at the end)",
        "fleet check exited (pid 300 at the start, 0 at the end)"]


def poison_b_and_d() -> Poison:
    return Poison(fails=lambda r: r in ("b", "d"), reason=lambda r: f"work_failed: builtins.ValueError: {r}")


def test_poison_outcomes_count_each_way_a_failed_by_design_request_can_end() -> None:
    ids = ["a", "b", "c", "d", "e", "f"]  # b and d fail by design
    letters = [("b", "work_failed: builtins.ValueError: b")]
    assert poison_outcomes(ids, poison_b_and_d(), letters, {"b": 1}, {"a", "c", "e", "f"}) == PoisonOutcomes(
        expected=2, dead_lettered_once=1, missing=1, twice=0, wrong_reason=0, unexpected=0,
        good_not_completed=0)
    # d twice on the topic, b with another reason, e dead-lettered though good, f not completed
    letters = [("b", "work_failed: builtins.ValueError: other"), ("d", "work_failed: builtins.ValueError: d"),
               ("e", "ai_unavailable: http_5xx")]
    ended = poison_outcomes(ids, poison_b_and_d(), letters, {"b": 1, "d": 2, "e": 1}, {"a", "c"})
    assert ended == PoisonOutcomes(expected=2, dead_lettered_once=0, missing=0, twice=1, wrong_reason=1,
                                   unexpected=1, good_not_completed=2)


def test_verdict_lists_each_poison_breach() -> None:
    poison = PoisonOutcomes(expected=20, dead_lettered_once=16, missing=1, twice=1, wrong_reason=2,
                            unexpected=0, good_not_completed=3)
    every_one_once = replace(poison, missing=0, twice=0, wrong_reason=0, good_not_completed=0,
                             dead_lettered_once=20)
    assert verdict(phase(figures=measured(poison=every_one_once))) == []
    assert verdict(phase(figures=measured(poison=poison))) == [
        "1 expected dead letters missing", "1 requests dead-lettered more than once",
        "2 dead letters without the work's exception",
        "3 requests the work does not fail left uncompleted"]


def test_request_of_reads_the_key_of_an_original_event_only() -> None:
    assert request_of(b'{"request_id": "r1", "style": "dark"}', "request_id") == "r1"
    assert request_of(b'{"request_id": "r1", "sty', "request_id") is None  # a letter by reference
    assert request_of(b"[1, 2]", "request_id") is None
    assert request_of(None, "request_id") is None


def test_the_outage_hangs_outlast_the_generate_stage_timeout() -> None:
    config = Settings().config()
    # at time scale 0.25 the client's timeout is learned between 4 x 3 x 0.25 = 3 s and the spec's
    # 30 x 0.25 = 7.5 s; the hang outlasts twice the most, in the stand-in's real-scale seconds
    assert (config.ai_timeout_floor("generate"), config.ai_timeout("generate")) == (3.0, 7.5)
    assert hang_s(config, ("generate",)) == 60.0


def test_the_outages_allow_no_dead_letter_and_bound_the_recovery() -> None:
    faults = {f.name: f for f in FAULTS}
    for name in ("ai-outage", "ai-outage-timeouts"):
        assert faults[name].planned_s == 60.0
        record = faults[name].record("faults-x", Settings().config())
        assert (record.allowed_dead_letters, record.max_recovery_s, record.fleets_stay_up,
                record.allowed_service_duplicates, record.exactly_once) == ({}, 10.0, True, 0, True)


def test_only_a_fleet_kill_allows_calls_served_twice_and_says_so_at_the_end() -> None:
    config = Settings().config()
    kills = [f for f in FAULTS if isinstance(f, FleetKill)]
    assert [(f.name, f.stage) for f in kills] == [("fleet-kill-check", "check"),
                                                  ("fleet-kill-generate", "generate")]
    # 4 members of 16 records each and 16 AI calls at once (test_settings_... below): 16 calls in flight
    assert [f.allowed_service_duplicates(config) for f in kills] == [16, 16]
    assert all(f.allowed_service_duplicates(config) == 0 for f in FAULTS if f not in kills)
    assert kills[1].closing_note(phase()) == (
        "fleet-kill-generate: in-flight window 16 calls (the most the service may serve twice); served "
        "twice: 16, by our rows: 16; output events seen twice (read_committed): 0")
    assert kills[1].closing_note(phase(figures=None)).endswith("served twice: -, by our rows: -; output "
                                                               "events seen twice (read_committed): -")
    assert all(f.closing_note(phase()) is None for f in FAULTS if f not in kills)


def test_an_injection_counts_its_own_records_per_topic_and_writes_them_in_its_detail() -> None:
    sent = Injection(10.0, 10.3, {"bytes": OVERSIZE_BYTES}, (("r.style", 3, 7), ("r.intake", 0, 2)))
    assert (sent.on("r.style"), sent.on("r.generate")) == (1, 0)
    assert sent.to_json() == {"fault_start": 10.0, "fault_end": 10.3, "fault_s": 0.3, "detail": {
        "records": [["r.style", 3, 7], ["r.intake", 0, 2]], "bytes": OVERSIZE_BYTES}}
    assert Injection(1.0, 3.0).to_json()["detail"] == {}


def test_a_phase_is_written_with_the_keys_it_reached() -> None:
    measured_keys = {"completed", "status", "dead_letters", "unexpected_dead_letters", "lost",
                     "injected_lost", "intake_unrecorded", "duplicate_results", "resent_notifications",
                     "outputs_read_committed", "duplicate_outputs", "duplicate_ai_calls", "service",
                     "service_duplicates", "service_hangs", "uncommitted", "pre_fault_rps", "fault_rps",
                     "longest_stall_s", "recovery_s", "steady_throughput_rps", "rebalances", "p99_ms",
                     "completions_per_second"}
    bounds = {"fault", "summary", "allowed_dead_letters", "max_recovery_s", "fleets_stay_up", "pipeline",
              "run_id", "allowed_service_duplicates", "exactly_once", "failures"}
    reached = phase(injection=Injection(20.0, 50.0), load=Load(0.0, 75.0, 1408, 1408),
                    fleet_pids={"generate": {"start": 1, "end": 2}})
    written = reached.to_json()
    assert set(written) == bounds | measured_keys | {
        "fault_start", "fault_end", "detail", "fault_s", "load_started", "load_ended", "source_acked",
        "produced", "fleet_pids"}
    assert (written["fault_s"], written["produced"], written["recovery_s"]) == (30.0, 1408, 11)
    poisoned = replace(reached, figures=measured(poison=PoisonOutcomes(20, 20, 0, 0, 0, 0, 0)))
    assert poisoned.to_json()["poison"] == {"expected": 20, "dead_lettered_once": 20, "missing": 0,
                                            "twice": 0, "wrong_reason": 0, "unexpected": 0,
                                            "good_not_completed": 0}
    failed = phase(figures=None, load=Load(0.0, 75.0, 1400, None, "exit code 1"), error="TimeoutError: x")
    assert set(failed.to_json()) == bounds | {"load_started", "load_ended", "source_acked", "source_error",
                                              "produced", "error"}
    run = FaultRun("faults-x", 0.25, 21.33, 18.77, {}, {}, [reached, replace(failed, failures=["1 lost"])])
    assert (run.passed, run.to_json()["passed"], len(run.to_json()["phases"])) == (False, False, 2)


def test_the_fault_pipeline_puts_the_raising_stage_in_front_of_the_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fault_pipeline.write_folder(tmp_path)
    shipped = {p.name for p in pipeline_spec.PIPELINES_DIR.glob("*.yaml")}
    assert {p.name for p in folder.glob("*.yaml")} == shipped | {f"{fault_pipeline.NAME}.yaml"}
    monkeypatch.setenv("PIPELINES_DIR", str(folder))
    spec = pipeline_spec.load(fault_pipeline.NAME)
    assert spec.stage_names == ("intake", "screen", "check", "generate")
    assert (spec.stages["screen"].source, spec.stages["check"].source) == ("style", "screened")
    assert spec.ai_stages == ("check", "generate") and spec.completing_stage == "generate"
    config = Settings().config(fault_pipeline.NAME)
    assert (config.stage("screen").mode, config.stage("screen").members) == ("flow", 1)


def test_the_fault_pipeline_raises_on_its_chosen_keys_with_the_reason_expected() -> None:
    # the first 8 bytes of sha256("request-54") are 0 mod 100, of sha256("request-0") 90 mod 100
    assert fault_pipeline.raises("request-54") and not fault_pipeline.raises("request-0")
    assert fault_pipeline.screen({"request_id": "request-0", "style": "dark"}) == {}
    with pytest.raises(ValueError) as raised:
        fault_pipeline.screen({"request_id": "request-54"})
    assert (f"work_failed: {type(raised.value).__module__}.ValueError: {raised.value}"
            == fault_pipeline.dead_letter_reason("request-54"))


def test_busiest_leader_prefers_the_lowest_id_among_equals() -> None:
    assert busiest_leader({("a", 0): 1, ("a", 1): 2, ("a", 2): 2, ("b", 0): 1}) == (1, 2)
    assert busiest_leader({("a", 0): 3, ("a", 1): 3, ("a", 2): 2}) == (3, 2)


def test_holdings_follow_assign_revoke_and_lost_in_order() -> None:
    group_events = [
        ("g-0", "assign", ["t:0", "t:1", "t:2", "t:3"]),
        ("g-1", "assign", []),  # joined, nothing yet (cooperative rebalance, first round)
        ("g-0", "revoke", ["t:2", "t:3"]),
        ("g-1", "assign", ["t:2", "t:3"]),
        ("g-1", "lost", ["t:3"]),
        ("g-2", "revoke", ["t:0"]),  # a member with no assignment on record holds nothing
    ]
    assert holdings(group_events) == {"g-0": {"t:0", "t:1"}, "g-1": {"t:2"}}


def test_in_flight_window_is_members_times_window_in_flow_mode() -> None:
    flow = PipelineConfig(stages={"generate": StageConfig("flow", members=4, window=4)})
    assert in_flight_window(flow, "generate") == 16
    bounded = PipelineConfig(stages={"generate": StageConfig("bounded", members=3, window=4)})
    assert in_flight_window(bounded, "generate") == 3


def test_oversize_records_exceed_the_producer_limit_and_are_refused_as_oversize() -> None:
    spec = pipeline_spec.load("genai_image")
    topics = events.Topics("run-x", spec)
    records = oversize_records("run-x", topics)
    assert [topic for topic, _ in records] == ["run-x.intake", "run-x.style", "run-x.generate"]
    stages = {"run-x.intake": "intake", "run-x.style": "check", "run-x.generate": "generate"}
    for topic, value in records:
        assert len(value) == OVERSIZE_BYTES
        assert 1_000_000 < len(value) < 1_048_588
        assert json.loads(value)["run_id"] == "run-x"
        with pytest.raises(events.InvalidEvent) as refused:
            events.parse(spec.validators[stages[topic]], value)
        assert refused.value.reason == "oversize"


def test_settings_put_the_load_at_88_percent_of_a_21_rps_capacity() -> None:
    s = Settings()
    assert s.capacity_rps == pytest.approx(21.333, abs=0.001)  # 16 slots / (3 s x 0.25)
    assert s.load_rps == 18.77  # 0.88 x 21.333
    config = s.config()
    assert (config.profile, config.replication_factor, config.partitions) == ("durability", 3, 16)
    generate = config.stage("generate")
    # 4 members holding 16 records each (four times their share of the calls), 16 AI calls at
    # once: the 16 slots.
    assert (generate.mode, generate.members, generate.window, generate.ai_calls) == ("flow", 4, 16, 16)
    assert generate.ai_calls_at_once == 16


def test_plot_writes_the_figure_as_a_png(tmp_path: Path) -> None:
    plot([phase()], 18.8, tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes().startswith(b"\x89PNG")  # what it draws: tests/unit/test_plots.py
