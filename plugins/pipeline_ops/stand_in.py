"""Runs against the AI stand-in (the demo, tests, benchmarks), not real model APIs: before a run
measures, the stand-in is set to the run's time scale and AI limit through its admin API
(`PUT /v1/config`). Only connections marked as the stand-in (extra `stand_in`) are touched, so a
real endpoint is never reconfigured."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import requests


def configure_for_run(served: Mapping[str, Sequence[str]], time_scale: float, limit: int) -> None:
    """Each stand-in (base URL -> the endpoint names it serves) at `time_scale`, every endpoint
    it serves at `limit` calls at once."""
    for url, endpoints in sorted(served.items()):
        response = requests.put(f"{url}/v1/config", timeout=10, json={
            "time_scale": time_scale, **{name: {"limit": limit} for name in endpoints}})
        response.raise_for_status()
