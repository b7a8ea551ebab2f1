"""The platform's Airflow operators, one module per role: the pipeline check and the candidate
(`check`, `candidate`), topics, fleets and load (`topics`, `deploy`, `load`), repeated trials and
the capacity search (`trials`, `capacity`), the gate and what follows it (`promotion`), Spark
analysis (`analysis`). Each is a thin shell around the runtime (`consumers`), the registry and the
gate; the steps they share are in `runs`."""
