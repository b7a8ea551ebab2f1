"""Where a local stack lives on disk and which loopback ports it uses.

Stacks run side by side: `dev` (what `make up` starts), `test` (what `make test` starts and
stops) and `faults` (what `make faults` starts, kills parts of and stops), so running the suite
or injecting faults never disturbs a stack someone is using. They differ only in their folder
and a port offset.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCAL = REPO / ".local"
KAFKA_JARS = LOCAL / "jars" / "kafka"

PORT_OFFSETS = {"dev": 0, "test": 10000, "faults": 20000}


@dataclass(frozen=True)
class Layout:
    """Folders and ports of one named stack."""

    name: str = "dev"

    @property
    def offset(self) -> int:
        if self.name not in PORT_OFFSETS:
            raise ValueError(f"unknown stack {self.name!r}; known: {sorted(PORT_OFFSETS)}")
        return PORT_OFFSETS[self.name]

    @property
    def root(self) -> Path:
        return LOCAL / self.name

    @property
    def env_file(self) -> Path:
        return self.root / "stack.env"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    def kafka_port(self, node_id: int) -> int:
        return 9091 + node_id + self.offset

    def controller_port(self, node_id: int) -> int:
        return 9191 + node_id + self.offset

    @property
    def postgres_port(self) -> int:
        return 5433 + self.offset

    @property
    def ai_service_port(self) -> int:
        return 8600 + self.offset

    @property
    def airflow_port(self) -> int:
        return 8080 + self.offset

    def bootstrap_servers(self, brokers: int) -> str:
        return ",".join(f"127.0.0.1:{self.kafka_port(i)}" for i in range(1, brokers + 1))

    def database_url(self, database: str = "pipeline") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.postgres_port}/{database}"


def current() -> Layout:
    """The stack named by STACK (default `dev`)."""
    return Layout(os.environ.get("STACK", "dev"))


def port_in_use(port: int) -> bool:
    """True when something already listens on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for_port(port: int, timeout_s: float) -> bool:
    """Poll until the port accepts connections or the timeout passes."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_in_use(port):
            return True
        time.sleep(0.2)
    return False
