"""The analysis jobs on the test stack's Spark standalone master, submitted as the DAGs submit
them without a Connect server (both in one application, spark/analyses.py, through
`SparkSubmitOperator` on `spark_default`) and run as they run with one (in the task, on the
stack's Spark Connect server), give exactly what `local[*]` gives; and the documentation's
`spark-submit` command (docs/analysis.md) runs as written."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.runs.pipeline_run import running_pipeline
from pipeline_ops.dag_support import spark_env
from pipeline_ops.operators.analysis import AnalysisSubmitOperator
from tests.integration.conftest import spark_master_lock
from tests.integration.pipeline_fixtures import TIME_SCALE, ai_service
from tests.stack import REPO, Stack

# The jobs on the stack's Spark master count the applications that finish there: alone on it
# (`spark_master_lock`) while they submit to it, not while the run they analyse or local[2] works.
pytestmark = pytest.mark.timeout(1200)

BURST = 80
LOCAL_CONN = "spark_local"


@pytest.fixture(scope="module")
def cluster_stack(stack: Stack) -> Stack:
    if stack.env.get("SPARK") != "cluster":
        pytest.fail("the test stack runs Spark locally: `make test` starts it with SPARK=cluster")
    return stack


@pytest.fixture(scope="module")
def run_id(cluster_stack: Stack) -> str:
    """A small flow run whose topics and rows the jobs analyse (on an AI stand-in of its own)."""
    config = PipelineConfig(partitions=4, time_scale=TIME_SCALE, replication_factor=1,
                            stages={"check": StageConfig("flow", members=1, window=8),
                                    "generate": StageConfig("flow", members=1, window=8)})
    with ai_service() as ai, running_pipeline(config, cluster_stack.kafka, cluster_stack.database_url,
                                              ai.endpoints) as pipeline:
        pipeline.send(BURST, reject_share=0.1)
        counts = pipeline.wait_terminal(BURST, timeout_s=120)
    assert sum(counts.values()) == BURST, counts
    return pipeline.run_id


def analyses_args(run_id: str, key: str, out: Path) -> list[str]:
    """Both jobs of spark/analyses.py, as the DAGs' `spark_analysis` task gives them, each writing
    its document into `out` (load.json, analysis.json)."""
    return ["partition_load", "--topics", f"{run_id}.style", "--run-id", key,
            "--output-json", str(out / "load.json"), "--",
            "pipeline_analysis", "--run-id", run_id, "--output-json", str(out / "analysis.json")]


def documents(out: Path) -> tuple[dict, dict]:
    """(partition_load's document without its run id, pipeline_analysis's document)."""
    return (dict(json.loads((out / "load.json").read_text()), run_id=None),
            json.loads((out / "analysis.json").read_text()))


def submit_both(run_id: str, conn_id: str, out: Path) -> tuple[dict, dict]:
    """Both jobs in one spark-submit through the operator the DAGs use, outside a DAG run (no
    templates to render), as the DAGs submit them without a Connect server."""
    out.mkdir()
    operator = AnalysisSubmitOperator(
        task_id=f"spark_analysis-{conn_id}", application=str(REPO / "spark" / "analyses.py"), name="analyses",
        conn_id=conn_id, env_vars=spark_env(),
        application_args=analyses_args(run_id, f"{run_id}-{conn_id}", out))
    operator.execute({})
    return documents(out)


@pytest.fixture(scope="module")
def local_spark(monkeypatch_module: pytest.MonkeyPatch) -> str:
    monkeypatch_module.setenv(f"AIRFLOW_CONN_{LOCAL_CONN.upper()}",
                              json.dumps({"conn_type": "spark", "host": "local[2]"}))
    return LOCAL_CONN


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def on_local(run_id: str, local_spark: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """Both jobs' documents from a spark-submit on local[2]: what every other way must give."""
    return submit_both(run_id, local_spark, tmp_path_factory.mktemp("local") / "out")


def test_the_jobs_on_the_standalone_master_match_local(cluster_stack: Stack, run_id: str,
                                                       on_local: tuple[dict, dict], tmp_path: Path) -> None:
    with spark_master_lock(cluster_stack):
        before = {app["id"] for app in cluster_stack.spark_master_status()["completedapps"]}
        on_cluster = submit_both(run_id, "spark_default", tmp_path / "cluster")
        completed = cluster_stack.spark_master_status()["completedapps"]
    # The cluster really ran them: the master lists one more finished application.
    finished = [app for app in completed if app["id"] not in before]
    assert [app["state"] for app in finished] == ["FINISHED"], finished
    assert on_cluster[0] == on_local[0]
    assert sum(p["records"] for p in on_cluster[0]["partitions"]) == BURST  # guard: not two empty scans
    assert on_cluster[1] == on_local[1]
    assert on_cluster[1]["requests"] == BURST


def test_the_analysis_runs_on_the_stacks_connect_server_as_the_dags_run_it(
        cluster_stack: Stack, run_id: str, on_local: tuple[dict, dict], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator with the DAGs' `spark_connect_default` runs both jobs of spark/analyses.py in
    this process, on the server the stack started on its standalone master: no spark-submit, no
    application of its own on the master."""
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: pytest.fail("spark-submit ran"))
    operator = AnalysisSubmitOperator(
        task_id="spark_analysis", application=str(REPO / "spark" / "analyses.py"), conn_id="spark_default",
        spark_connect_conn_id="spark_connect_default",
        application_args=analyses_args(run_id, f"{run_id}-connect", tmp_path))
    with spark_master_lock(cluster_stack):
        before = cluster_stack.spark_master_status()
        operator.execute({})
        after = cluster_stack.spark_master_status()
    assert [app["id"] for app in after["completedapps"]] == [app["id"] for app in before["completedapps"]]
    assert [app["name"] for app in after["activeapps"]] == ["spark-connect"]
    assert documents(tmp_path) == on_local


def readme_command() -> str:
    """The documentation's spark-submit example, exactly as a user would copy it."""
    text = (REPO / "docs" / "analysis.md").read_text()
    block = re.search(r"<!-- spark-submit example -->\n```bash\n(.*?)```", text, re.DOTALL)
    assert block, "docs/analysis.md lost its spark-submit example"
    return block.group(1)


@pytest.mark.usefixtures("spark_master")  # the command submits to the stack's master
def test_the_readme_spark_submit_command_runs_as_written(cluster_stack: Stack, run_id: str,
                                                         tmp_path: Path) -> None:
    command = readme_command()
    assert "spark-submit spark/partition_load.py" in command and "--jars" not in command
    topic, output = f"{run_id}.style", Path("/tmp") / f"{run_id}-load.json"
    # The example is for the dev stack and a topic of its own: run it on this stack and run.
    script = (command.replace(".local/stack.env", str(cluster_stack.layout.env_file))
              .replace("demo.style", topic).replace("/tmp/partition_load.json", str(output)))
    started = time.time()
    proc = subprocess.run(["bash", "-euc", script], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={"HOME": str(tmp_path), "PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    document = json.loads(output.read_text())
    assert output.stat().st_mtime >= started
    assert sum(p["records"] for p in document["partitions"]) == BURST
    output.unlink()
