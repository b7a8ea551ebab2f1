"""Deployment backends of the consumer fleets behind one interface (`FleetBackend`): supervisord
programs on this machine (`FleetSupervisor`) or Kubernetes Deployments (`kubernetes`), chosen by
an Airflow connection (`backend_for`)."""

from __future__ import annotations

from airflow.exceptions import AirflowNotFoundException
from airflow.sdk import BaseHook

from pipeline_ops.fleets.backend import FleetBackend, FleetEnvironment
from pipeline_ops.fleets.supervisord import FleetSupervisor

__all__ = ["FleetBackend", "FleetEnvironment", "FleetSupervisor", "backend_for"]


def backend_for(fleet_conn_id: str, postgres_conn_id: str = "postgres_default") -> FleetBackend:
    """Kubernetes when `fleet_conn_id` is a connection of type `kubernetes` (its extra: the
    `namespace`, `fleet_image`, `keda`), supervisord when there is no such connection; any other
    type is refused rather than ignored."""
    try:
        conn_type = BaseHook.get_connection(fleet_conn_id).conn_type
    except AirflowNotFoundException:
        return FleetSupervisor(postgres_conn_id)
    if conn_type != "kubernetes":
        raise ValueError(f"connection {fleet_conn_id} is of type {conn_type!r}: fleets run on a "
                         "`kubernetes` connection, or under supervisord when there is none")
    from pipeline_ops.fleets.kubernetes import KubernetesFleets  # the Kubernetes client only when used

    return KubernetesFleets(fleet_conn_id, postgres_conn_id)
