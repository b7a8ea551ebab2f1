"""The capacity search end to end on the local stack: `pipeline_capacity` through `airflow dags
test` on the flow configuration, then its result and where the plot is.

    python -m infra.capacity             # time scale 0.3: the 3 s generation takes 0.9 s
    SCALE=1 python -m infra.capacity     # real AI latencies (longer steps: about an hour)
"""

from __future__ import annotations

import os
import sys

from infra.demo import run_dag
from infra.layout import REPO, current


def main() -> int:
    layout = current()
    scale = float(os.environ.get("SCALE", "0.3"))
    conf = {"candidate": os.environ.get("CANDIDATE", "flow"), "time_scale": scale,
            "step_s": max(30.0, 90 * scale)}
    state, ts = run_dag(layout, "pipeline_capacity", conf)
    results = sorted((REPO / "results").glob(f"capacity-{ts}-*/capacity.txt"))
    if state != "success" or not results:
        print(f"the search did not finish: see .local/{layout.name}/pipeline_capacity.log", file=sys.stderr)
        return 1
    print(results[-1].read_text())
    print(f"plot: {results[-1].parent / 'capacity.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
