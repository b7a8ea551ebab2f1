"""Airflow-side code of the platform: operators, hooks and the promotion gate."""
