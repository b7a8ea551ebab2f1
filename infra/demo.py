"""The main job end to end on the local stack: `pipeline_tuning` through `airflow dags test`,
then the gate report and where the plots are.

    python -m infra.demo                # fast time scale (0.05)
    SCALE=1 python -m infra.demo        # real AI latencies (3 s per generation)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg2

from infra.layout import REPO, current


def main() -> int:
    layout = current()
    scale = float(os.environ.get("SCALE", "0.05"))
    conf = {"time_scale": scale}
    if scale >= 0.5:  # at real scale a smaller burst keeps the demo to a few minutes
        conf["burst"] = 160
    logical_date = datetime.now(UTC).replace(microsecond=0).isoformat()
    airflow = str(Path(sys.executable).parent / "airflow")
    started = time.monotonic()
    print(f"running pipeline_tuning with {json.dumps(conf)} (log: .local/{layout.name}/demo.log)")
    with open(layout.root / "demo.log", "w") as log:
        subprocess.run([airflow, "dags", "test", "pipeline_tuning", logical_date, "-c", json.dumps(conf)],
                       stdout=log, stderr=subprocess.STDOUT, cwd=REPO, check=False)
    with psycopg2.connect(layout.database_url("airflow")) as conn, conn.cursor() as cur:
        cur.execute("SELECT state FROM dag_run WHERE dag_id = 'pipeline_tuning' AND logical_date = %s",
                    (logical_date,))
        row = cur.fetchone()
    state = row[0] if row else "missing"
    reports = sorted((REPO / "results").glob("tuning-*/gate.txt"), key=lambda p: p.stat().st_mtime)
    print(f"pipeline_tuning: {state} in {time.monotonic() - started:.0f}s")
    if state != "success" or not reports:
        print(f"the run did not finish: see .local/{layout.name}/demo.log", file=sys.stderr)
        return 1
    print(reports[-1].read_text())
    print(f"plots: {reports[-1].parent / 'completions.png'}, "
          f"{reports[-1].parent / 'requests_per_partition.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
