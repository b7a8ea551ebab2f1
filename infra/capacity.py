"""The capacity search end to end on the local stack: `pipeline_capacity` through `airflow dags
test` on the flow configuration, then its result and where the plot is.

    python -m infra.capacity             # time scale 0.3: the 3 s generation takes 0.9 s
    SCALE=1 python -m infra.capacity     # real AI latencies (longer steps: about an hour)
"""

from __future__ import annotations

import os
import sys

from infra.demo import run_and_show
from infra.layout import current


def main() -> int:
    layout = current()
    scale = float(os.environ.get("SCALE", "0.3"))
    conf = {"candidate": os.environ.get("CANDIDATE", "flow"), "time_scale": scale,
            "step_s": max(30.0, 90 * scale)}
    return run_and_show(layout, "pipeline_capacity", conf, "capacity-{ts}-*/capacity.txt", ("capacity.png",))


if __name__ == "__main__":
    sys.exit(main())
