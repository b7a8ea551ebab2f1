"""Check a spec or a quota, or list the specs and quotas found:

    python -m consumers.config.pipeline_spec check pipelines/genai_image.yaml
    python -m consumers.config.pipeline_spec check quotas/ai_service
    python -m consumers.config.pipeline_spec list
"""

from __future__ import annotations

import argparse

from consumers.config.pipeline_spec.files import (
    QUOTAS,
    available,
    check,
    is_quota,
    load,
    load_quota,
    quota_names,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m consumers.config.pipeline_spec", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = p.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="validate a spec (a name or a path) or a quota (quotas/<name>, or "
                                      "a path in a quotas/ folder)").add_argument("spec")
    commands.add_parser("list", help="the specs found, then the quotas (as quotas/<name>)")
    args = p.parse_args(argv)
    if args.command == "list":
        print("\n".join([*available(), *(f"{QUOTAS}/{name}" for name in quota_names())]))
        return 0
    return check(load_quota if is_quota(args.spec) else load, args.spec)


if __name__ == "__main__":
    raise SystemExit(main())
