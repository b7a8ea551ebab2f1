"""The machine-noise figures of a benchmark phase: CPU shares from /proc/stat readings, late
wake-ups of the probe, and the probe process itself."""

from __future__ import annotations

import time

import pytest

from bench import machine_noise

# /proc/stat's first lines, 100 jiffies a second: user nice system idle iowait irq softirq steal
BEFORE = "cpu  1000 0 500 8000 100 0 0 200 0 0\ncpu0 500 0 250 4000 50 0 0 100 0 0\n"
AFTER = "cpu  1060 0 530 8080 20 0 0 220 0 0\ncpu0 530 0 265 4040 60 0 0 110 0 0\n"


def test_cpu_times_reads_the_aggregate_line() -> None:
    # total 1000+500+8000+100+200 = 9800; busy user 1000 + system 500
    assert machine_noise.cpu_times(BEFORE) == (9800, 1500, 200)


def test_cpu_shares_over_two_readings() -> None:
    before, after = machine_noise.cpu_times(BEFORE), machine_noise.cpu_times(AFTER)
    # after: total 1060+530+8080+20+220 = 9910, 110 jiffies later; busy 1590, 90 more: 81.8 %;
    # steal 220, 20 more: 18.2 % (idle and iowait together did not move)
    assert machine_noise.cpu_shares(before, after) == {"cpu_busy_pct": 81.8, "cpu_steal_pct": 18.2}


def test_cpu_shares_without_time_passing_are_unknown() -> None:
    same = machine_noise.cpu_times(BEFORE)
    assert machine_noise.cpu_shares(same, same) == {"cpu_busy_pct": None, "cpu_steal_pct": None}


def test_lateness_counts_wakeups_at_or_over_the_threshold() -> None:
    figures = machine_noise.lateness_figures([0.1, 9.9, 10.0, 0.0, 37.5], threshold_ms=10.0)
    assert figures == {"probe_wakeups": 5, "late_wakeups": 2, "late_wakeup_ms_total": 47.5,
                       "latest_wakeup_ms": 37.5}


def test_no_wakeups_have_no_latest() -> None:
    assert machine_noise.lateness_figures([])["latest_wakeup_ms"] is None


def test_the_probe_process_wakes_for_as_long_as_the_block_runs() -> None:
    with machine_noise.measured() as noise:
        time.sleep(1.0)
    figures = noise.figures
    # 5 ms sleeps over at least 1 s: no more than 200 wake-ups, and many of them even on a busy
    # machine (the interpreter's start-up counts against the block, not the probe)
    assert 20 <= figures["probe_wakeups"] <= 200
    assert 0 <= figures["late_wakeups"] <= figures["probe_wakeups"]
    if machine_noise.PROC_STAT.exists():
        assert 0 <= figures["cpu_busy_pct"] <= 100
        assert 0 <= figures["cpu_steal_pct"] <= 100 - figures["cpu_busy_pct"]


def test_a_failing_block_raises_its_own_error_without_figures() -> None:
    with pytest.raises(RuntimeError, match="phase failed"), machine_noise.measured() as noise:
        raise RuntimeError("phase failed")
    assert noise.figures == {}
