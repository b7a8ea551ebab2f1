"""Prometheus metrics of a consumer worker, labelled by stage and group member."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, start_http_server

IN_FLIGHT = Gauge("pipeline_in_flight", "Records being processed now", ["stage", "member"])
BUFFERED = Gauge("pipeline_buffered", "Records fetched and waiting for a processing slot",
                 ["stage", "member"])
COMPLETED = Counter("pipeline_completed_total", "Records processed to completion", ["stage", "member"])
ERRORS = Counter("pipeline_dead_lettered_total", "Records sent to the dead-letter topic",
                 ["stage", "member", "reason"])
WAITING = Counter("pipeline_waiting_total", "Tries of a record that met a failing dependency "
                  "(the record waits and is tried again)", ["stage", "member", "reason"])
RETRIES = Counter("pipeline_ai_retries_total", "AI call tries beyond the first", ["stage", "member"])
DUPLICATES = Counter("pipeline_reconsumed_total", "Records whose result already existed",
                     ["stage", "member"])
REBALANCES = Counter("pipeline_rebalance_events_total", "Assignments, revocations and losses",
                     ["stage", "member", "event"])
LAG = Gauge("pipeline_consumer_lag", "Consumer lag summed over assigned partitions", ["stage", "member"])
CIRCUIT = Gauge("pipeline_ai_circuit_state", "An AI endpoint's circuit: 0 closed, 1 half-open, 2 open",
                ["stage", "endpoint"])
PAUSED = Gauge("pipeline_paused", "1 while the member has paused its partitions", ["stage", "member"])


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics on host:port (0 disables); a pod's probe needs 0.0.0.0."""
    if port:
        start_http_server(port, addr=host)
