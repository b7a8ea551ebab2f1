"""Check a spec, or list the specs found:

    python -m consumers.config.pipeline_spec check pipelines/genai_image.yaml
    python -m consumers.config.pipeline_spec list
"""

from __future__ import annotations

import argparse

from consumers.config.pipeline_spec.files import available, check, load


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m consumers.config.pipeline_spec", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = p.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="validate a spec (a name or a path)").add_argument("spec")
    commands.add_parser("list", help="the specs found")
    args = p.parse_args(argv)
    if args.command == "list":
        print("\n".join(available()))
        return 0
    return check(load, args.spec)


if __name__ == "__main__":
    raise SystemExit(main())
