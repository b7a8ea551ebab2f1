"""Reading Kafka's ConsumerPerformance summary, on hand-written output in the tool's format."""

from __future__ import annotations

import pytest

from bench.spark_partition_load import ConsumerPerf, parse_consumer_perf

HEADER = ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
          "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
# 10M records in 5 s, of which 1 s joining the group: 2M records/s overall, 2.5M while fetching.
SUMMARY = ("2026-01-01 00:00:00:000, 2026-01-01 00:00:05:000, 1106.2622, 221.2524, 10000000, "
           "2000000.0000, 1000, 4000, 276.5656, 2500000.0000")


def test_summary_figures_by_column_name() -> None:
    assert parse_consumer_perf(f"{HEADER}\n{SUMMARY}\n") == ConsumerPerf(
        records=10_000_000, records_per_s=2_000_000.0, fetch_records_per_s=2_500_000.0,
        rebalance_ms=1000, fetch_ms=4000)


def test_lines_around_the_summary_are_ignored() -> None:
    output = f"[2026-01-01 00:00:00,000] INFO Starting consumer...\n{HEADER}\n{SUMMARY}\n\n"
    assert parse_consumer_perf(output).records == 10_000_000


def test_a_warning_between_header_and_summary_is_skipped() -> None:
    warning = ("WARNING: Exiting before consuming the expected number of messages: timeout (10000 ms) "
               "exceeded. You can use the --timeout option to increase the timeout.")
    short = SUMMARY.replace("10000000", "9000000", 1)
    assert parse_consumer_perf(f"{HEADER}\n{warning}\n{short}\n").records == 9_000_000


def test_output_without_a_summary_is_refused() -> None:
    with pytest.raises(ValueError, match="no ConsumerPerformance summary"):
        parse_consumer_perf(f"{HEADER}\n")
    with pytest.raises(ValueError, match="no ConsumerPerformance summary"):
        parse_consumer_perf("Exception in thread main: topic does not exist\n")
