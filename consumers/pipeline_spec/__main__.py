"""Check a spec, or list the specs found:

    python -m consumers.pipeline_spec check pipelines/genai_image.yaml
    python -m consumers.pipeline_spec list
"""

from __future__ import annotations

import argparse
import sys

from consumers.pipeline_spec.files import available, load
from consumers.pipeline_spec.models import SpecError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m consumers.pipeline_spec", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = p.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="validate a spec (a name or a path)")
    check.add_argument("spec")
    commands.add_parser("list", help="the specs found")
    args = p.parse_args(argv)
    if args.command == "list":
        print("\n".join(available()))
        return 0
    try:
        spec = load(args.spec)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(spec.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
