"""The /metrics ports of supervised fleets follow the stack's port rule: below Linux's ephemeral
range (32768 up), where a listening port can already be some outgoing connection's source
port, and apart from every stack's own ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from consumers.config.candidate import PipelineConfig
from host import supervisor
from infra.layout import PORT_OFFSETS, Layout
from infra.stack import ports as stack_ports
from pipeline_ops.fleets.supervisord import FleetSupervisor

EPHEMERAL_START = 32768


class Records:
    """The deployments table, as far as starting a run asks it."""

    def refuse_running(self, run_id: str) -> None:
        pass

    def now(self) -> object:
        return None


def deployed_ports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: int) -> list[int]:
    """The metrics port of every stage of `runs` runs the supervisord backend starts."""
    ports: list[int] = []
    fleets = FleetSupervisor(paths=supervisor.Paths(tmp_path))
    fleets.records = Records()  # type: ignore[assignment]
    monkeypatch.setattr(fleets, "_client", lambda: None)
    monkeypatch.setattr(fleets, "_deploy", lambda *args, **kwargs: ports.append(args[-1]))
    monkeypatch.setattr(fleets, "_wait_ready", lambda *args: None)
    monkeypatch.setattr(fleets, "describe", lambda run_id: [])
    config = PipelineConfig.from_argument("{}")
    for run in range(runs):
        fleets.start(f"run-{run}", 1, config, env=None)  # type: ignore[arg-type]
    return ports


def test_fleets_serve_metrics_below_the_ephemeral_range_and_off_every_stacks_ports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = deployed_ports(tmp_path, monkeypatch, runs=20)
    assert ports and all(port < EPHEMERAL_START for port in ports), sorted(ports)
    stacks = {port for name in PORT_OFFSETS for port in stack_ports(Layout(name), 3, "cluster").values()}
    assert not stacks & set(ports)
    assert len(set(ports)) == len(ports)  # picked before any fleet listens: none picked twice
    for port in ports:  # free when picked, and still free: nothing here listens on it
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
