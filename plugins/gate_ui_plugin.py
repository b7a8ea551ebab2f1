"""Registers the gate page (pipeline_ops.ui) with Airflow: the app on the API server under
/pipeline-gate, and a navigation entry (Browse > Pipeline gate) that shows it inside the UI at
/plugin/pipeline-gate."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.plugins_manager import AirflowPlugin

from pipeline_ops.ui import MOUNT, app


class PipelineGatePlugin(AirflowPlugin):
    """The promotion gate's decisions, the active version and the promotions, the pipelines'
    dead letters (with their redrive) and AI endpoint circuits, the quotas they share, and the
    canaries on live traffic, in the Airflow UI."""

    name = "pipeline_gate"
    # Airflow reads these off the class; its base declares them without ClassVar.
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [  # type: ignore[misc]
        {"app": app, "url_prefix": MOUNT, "name": "Pipeline gate"}]
    # With a url_route the UI embeds href in its own frame instead of opening a new tab.
    external_views: ClassVar[list[dict[str, Any]]] = [  # type: ignore[misc]
        {"name": "Pipeline gate", "href": f"{MOUNT}/", "destination": "nav",
         "url_route": "pipeline-gate", "category": "browse"}]
