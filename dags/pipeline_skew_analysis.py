"""Spark analysis of one pipeline run: partition load and skew, latency, duplicates, rebalances."""

from __future__ import annotations

from airflow.sdk import Param

from pipeline_ops import dag_support as s


@s.pipeline_dag(
    "pipeline_skew_analysis", "spark",
    params={"pipeline": s.pipeline_param(),
            "run_id": Param("", type="string", minLength=1, pattern="^[a-zA-Z0-9._-]+$",
                            description="the run to analyse (its topics are <run_id>.*)")},
    doc_md="""
### Skew analysis
`SparkSubmitOperator` on `spark_default` (local[*] here; a `spark://` master when the connection
says so) runs, in one Spark application (`spark/analyses.py`), `spark/partition_load.py` over the
run's measured topic (the pipeline spec's `load.measure`: load, skew and its diagnosis) and
`spark/pipeline_analysis.py` over its records, with the spec's completing stage as the final one;
results go to the `analysis_*` tables. The spec is checked first.
""",
)
def pipeline_skew_analysis() -> None:
    s.check_pipeline() >> s.spark_analysis("[params.run_id]", "{{ params.run_id }}")


pipeline_skew_analysis()
