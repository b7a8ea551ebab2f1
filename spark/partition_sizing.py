"""Partitions needed for a target throughput, from measured per-partition rates.

partitions = max(ceil(t / t_produce), ceil(t / t_consume)), where t_produce and t_consume are
what one partition sustains on the produce and the consume side. For AI consumers one partition
is processed at most `concurrency per partition` calls at a time, each taking the service time,
so t_consume = concurrency / service time. Every rate is in the same unit (records/s, or MB/s
for all three). Partitions can only grow, and growing them changes which partition a key hashes
to, so a result above the current count comes with that warning.

Plain Python (no Spark needed), runnable as `python -m spark.partition_sizing` or through
spark-submit like the other jobs; inputs come from the options or from a JSON file whose keys
are the option names with underscores (options given on the command line win).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: import the project from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from spark import job_io

# Rates are measured figures: a quotient a hair above an integer (75.00000000000001) is that integer.
_EPSILON = 1e-9


@dataclass(frozen=True)
class SizingInput:
    """Measured rates and the goal; give consume_per_partition or concurrency and service time."""

    target: float
    produce_per_partition: float
    consume_per_partition: float | None = None
    concurrency_per_partition: float | None = None
    service_time_s: float | None = None
    current_partitions: int | None = None


def partitions_for(target: float, per_partition: float) -> int:
    """ceil(target / per_partition), at least 1."""
    if per_partition <= 0:
        raise ValueError("a per-partition rate must be positive")
    return max(1, math.ceil(target / per_partition - _EPSILON))


def consume_rate(inputs: SizingInput) -> tuple[float, str]:
    """t_consume and how it was obtained."""
    if inputs.consume_per_partition is not None:
        return inputs.consume_per_partition, "measured"
    if inputs.concurrency_per_partition is None or inputs.service_time_s is None:
        raise ValueError("give consume_per_partition, or concurrency_per_partition and service_time_s")
    if inputs.service_time_s <= 0:
        raise ValueError("service_time_s must be positive")
    return inputs.concurrency_per_partition / inputs.service_time_s, (
        f"{inputs.concurrency_per_partition:g} concurrent calls / {inputs.service_time_s:g} s service time")


def size(inputs: SizingInput) -> dict[str, Any]:
    """The partition count with its two terms, the reasoning as text, and a warning if any."""
    t = inputs.target
    t_consume, consume_source = consume_rate(inputs)
    by_produce = partitions_for(t, inputs.produce_per_partition)
    by_consume = partitions_for(t, t_consume)
    partitions = max(by_produce, by_consume)
    limiting = "both" if by_consume == by_produce else "consume" if by_consume > by_produce else "produce"
    reasoning = [
        f"produce side: ceil({t:g} / {inputs.produce_per_partition:g} per partition) = {by_produce}",
        f"consume side: t_consume = {t_consume:g} per partition ({consume_source}); "
        f"ceil({t:g} / {t_consume:g}) = {by_consume}",
        f"partitions = max({by_produce}, {by_consume}) = {partitions}, limited by: {limiting}",
    ]
    current = inputs.current_partitions
    warning = None
    if current is not None and partitions > current:
        warning = (f"growing from {current} to {partitions} partitions changes the partition of most keys "
                   "(hash mod partition count): per-key ordering does not hold across the change and "
                   "keyed state moves; partitions can never be removed again")
    elif current is not None:
        reasoning.append(f"the current {current} partitions suffice; partitions cannot shrink")
    return {"inputs": asdict(inputs), "t_consume": t_consume, "by_produce": by_produce,
            "by_consume": by_consume, "partitions": partitions, "limiting": limiting,
            "reasoning": reasoning, "warning": warning}


def read_inputs(args: argparse.Namespace) -> SizingInput:
    """Inputs from the JSON file, overridden by the options given on the command line."""
    values: dict[str, Any] = json.loads(args.inputs_json.read_text()) if args.inputs_json else {}
    names = {f.name for f in fields(SizingInput)}
    unknown = set(values) - names
    if unknown:
        raise SystemExit(f"unknown keys in {args.inputs_json}: {', '.join(sorted(unknown))}")
    values.update({n: getattr(args, n) for n in names if getattr(args, n) is not None})
    missing = {"target", "produce_per_partition"} - set(values)
    if missing:
        raise SystemExit(f"missing inputs: {', '.join(sorted(missing))}")
    return SizingInput(**values)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    job_io.add_common_args(parser, spark=False)
    parser.add_argument("--inputs-json", type=Path, help="JSON object with the inputs below")
    parser.add_argument("--target", type=float, help="target throughput t")
    parser.add_argument("--produce-per-partition", type=float, help="measured t_produce per partition")
    parser.add_argument("--consume-per-partition", type=float, help="measured t_consume per partition")
    parser.add_argument("--concurrency-per-partition", type=float,
                        help="AI consumers: calls in flight per partition (instead of t_consume)")
    parser.add_argument("--service-time-s", type=float, help="AI consumers: seconds per call")
    parser.add_argument("--current-partitions", type=int, help="the topic's partition count today")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    try:
        figures = size(read_inputs(args))
    except ValueError as err:
        raise SystemExit(str(err)) from None
    run_id = args.run_id or job_io.default_run_id("sizing")
    job_io.write_json(args.output_json, {"run_id": run_id, **figures})
    if args.database_url:
        job_io.upsert_figures(args.database_url, "analysis_sizing", run_id, figures)
    print("\n".join(figures["reasoning"]))
    if figures["warning"]:
        print(f"warning: {figures['warning']}")
    return figures


if __name__ == "__main__":
    main()
