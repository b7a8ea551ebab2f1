"""Pure definitions shared by the runtime, the Spark jobs, the benchmark and the Airflow side:
what each figure of a run means (`measure.figures`), the capacity as the binding limit over the
AI endpoints (`measure.capacity`), what the AI calls cost (`measure.cost`), how fairly the
pipelines on one provider quota shared it (`measure.quota_share`) and the confidence bounds the
gate decides on (`measure.confidence`). Plain Python: importing it pulls in neither PySpark nor
Airflow."""
