"""Processes and files on this machine, for whoever starts them: the local stack (infra/), the
Airflow plugin's supervisord backend (pipeline_ops.fleets) and the benchmarks. Starting and
stopping processes, owner-only files, supervisord and its client: no stack and no Airflow here,
so the plugin uses them wherever Airflow runs."""
