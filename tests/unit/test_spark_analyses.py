"""The combined analysis application's command line (spark/analyses.py)."""

from __future__ import annotations

import pytest

from spark import analyses


def test_jobs_are_split_on_the_separator_in_order() -> None:
    argv = ["partition_load", "--topics", "a.style,b.style", "--run-id", "r", "--",
            "pipeline_analysis", "--run-id", "a,b", "--final-stage", "generate"]
    assert analyses.split(argv) == [
        ("partition_load", ["--topics", "a.style,b.style", "--run-id", "r"]),
        ("pipeline_analysis", ["--run-id", "a,b", "--final-stage", "generate"])]
    assert analyses.split(["partition_load", "--topics", "t"]) == [("partition_load", ["--topics", "t"])]


@pytest.mark.parametrize("argv", [[], ["partition_load", "--topics", "t", "--"], ["nope", "--x"]])
def test_an_empty_or_unknown_job_is_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        analyses.split(argv)
