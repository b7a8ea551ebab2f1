"""Unit tests run without the stack: Airflow, imported by the operator tests, gets a home of its
own under .local/ instead of ~/airflow when no stack env set one."""

from __future__ import annotations

import os

from infra.layout import LOCAL

os.environ.setdefault("AIRFLOW_HOME", str(LOCAL / "unit" / "airflow"))
