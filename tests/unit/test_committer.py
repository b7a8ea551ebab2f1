"""The exactly-once committer's schedule: at once when records completed, never closer than its
gap, at least every interval; a failure ends it and is handed over."""

from __future__ import annotations

import threading
import time

from consumers.committer import Committer


class Commits:
    def __init__(self, fail_with: Exception | None = None) -> None:
        self.at: list[float] = []
        self.fail_with = fail_with
        self.happened = threading.Event()

    def __call__(self) -> None:
        self.at.append(time.monotonic())
        self.happened.set()
        if self.fail_with is not None:
            raise self.fail_with


def test_completed_records_commit_without_waiting_for_the_interval() -> None:
    commits = Commits()
    committer = Committer("m", commits, lambda exc: None, min_gap_s=0.0, max_gap_s=60.0).start()
    try:
        committer.wanted()
        assert commits.happened.wait(10), "no commit within 10 s of being wanted, the interval being 60 s"
    finally:
        committer.stop()


def test_commits_are_never_closer_than_the_gap() -> None:
    commits = Commits()
    committer = Committer("m", commits, lambda exc: None, min_gap_s=0.2, max_gap_s=60.0).start()
    deadline = time.monotonic() + 20
    try:
        while len(commits.at) < 3 and time.monotonic() < deadline:
            committer.wanted()  # wanted all the time, as under load
            time.sleep(0.01)
    finally:
        committer.stop()
    assert len(commits.at) >= 3
    assert min(b - a for a, b in zip(commits.at, commits.at[1:], strict=False)) >= 0.19


def test_without_completions_it_still_commits_every_interval() -> None:
    commits = Commits()
    committer = Committer("m", commits, lambda exc: None, min_gap_s=0.0, max_gap_s=0.05).start()
    try:
        assert commits.happened.wait(10)
    finally:
        committer.stop()


def test_a_failed_commit_ends_it_and_is_handed_over() -> None:
    failure = RuntimeError("fenced")
    commits, handed = Commits(fail_with=failure), []
    committer = Committer("m", commits, handed.append, min_gap_s=0.0, max_gap_s=60.0).start()
    committer.wanted()
    assert commits.happened.wait(10)
    committer.stop()  # returns: the thread ended with the failure
    assert handed == [failure] and len(commits.at) == 1
