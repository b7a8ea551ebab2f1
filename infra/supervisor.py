"""The stack's supervisord (host/supervisor.py): where it lives, and supervisorctl for it.

`up` starts it with the stack, `down` stops it after every fleet; its folder is
`.local/<stack>/supervisor/`, its address SUPERVISOR_URL in the stack env.

    python -m infra.supervisor ctl status             # supervisorctl for the STACK's supervisord
    python -m infra.supervisor ctl tail -f <program>
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from supervisor import supervisorctl

from host.supervisor import Paths
from infra.layout import Layout, current


def stack_paths(layout: Layout) -> Paths:
    return Paths(layout.root / "supervisor")


def ctl(paths: Paths, args: Sequence[str]) -> None:
    """supervisorctl against this daemon (status, tail, restart, ...)."""
    supervisorctl.main(args=["-c", str(paths.conf), *args])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ctl_cmd = sub.add_parser("ctl", help="supervisorctl for the STACK's supervisord (e.g. `ctl status`)")
    ctl_cmd.add_argument("args", nargs=argparse.REMAINDER, help="supervisorctl's command and arguments")
    ctl(stack_paths(current()), parser.parse_args().args)


if __name__ == "__main__":
    main()
