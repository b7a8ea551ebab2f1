"""The CPU each kind of process spent, on /proc lines and command lines written out by hand."""

from __future__ import annotations

import pytest

from bench.process_cpu import by_role, cpu_seconds, role_of


def test_a_process_s_role_comes_from_its_command_line() -> None:
    assert role_of("java -Xmx768m -cp .local/jars/kafka/* kafka.Kafka .local/dev/kafka-1/server.properties") \
        == "brokers"
    assert role_of("python -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=4)") \
        == "pipeline"
    assert role_of("python -m consumers.stand_in --port 8600") == "stand-in"
    assert role_of("postgres: postgres pipeline 127.0.0.1(56986) idle") == "postgres"
    assert role_of("sshd: root@pts/0") == "other"


def test_cpu_seconds_are_utime_and_stime_counted_after_a_command_name_with_spaces() -> None:
    # fields 14 and 15 (utime 250, stime 50 ticks) after a name that holds spaces and a ')'
    stat = "1234 (python -m x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 5000"
    assert cpu_seconds(stat, 100.0) == 3.0


def test_each_role_sums_what_its_processes_spent_between_the_two_snapshots() -> None:
    before = {1: ("brokers", 10.0), 2: ("pipeline", 1.0), 3: ("pipeline", 2.0), 4: ("other", 5.0)}
    # 5 started inside the phase and is not counted; 4 ended inside it
    after = {1: ("brokers", 14.5), 2: ("pipeline", 4.0), 3: ("pipeline", 2.5), 5: ("pipeline", 9.0)}
    assert by_role(before, after) == {"brokers": 4.5, "pipeline": pytest.approx(3.5)}
    assert list(by_role(before, after)) == ["brokers", "pipeline"]  # the busiest first
