"""The partition-sizing job: `measure.sizing`'s formula from the command line or spark-submit.

Plain Python (no Spark needed), runnable as `python -m spark.partition_sizing` or through
spark-submit like the other jobs; inputs come from the options or from a JSON file whose keys
are the option names with underscores (options given on the command line win). The result goes
to `analysis_sizing` and, optionally, a JSON file.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: import the project from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from measure.sizing import SizingInput, size
from spark import job_io


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
