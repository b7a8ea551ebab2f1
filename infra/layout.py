"""Where a local stack lives on disk and which loopback ports it uses.

Stacks run side by side: `dev` (what `make up` starts), `test` (what `make test` starts and
stops), `secure` (the secured stack `make test` starts beside it), `durable` (the three-broker
stack `make bench` starts beside `dev` for its `durable` scenario) and `faults` (what
`make faults` starts, kills parts of and stops), so running the suite or injecting faults never
disturbs a stack someone is using. They differ only in their folder and a port offset.

A stack is started `plaintext` or `sasl_ssl` (SECURITY). Either way its passwords live in its
`stack.env` only (owner-only), which is also where everything reads them back from.
"""

from __future__ import annotations

import os
import shlex
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

REPO = Path(__file__).resolve().parent.parent
LOCAL = REPO / ".local"
KAFKA_JARS = LOCAL / "jars" / "kafka"

# Every port of every stack stays below 32768, where Linux's ephemeral range begins: a listening
# port inside it can already be the source port of some outgoing connection (at offset 30000 the
# secure stack's third controller port, 39194, was, and that broker could not start). Supervised
# fleets serve /metrics from above them all (pipeline_ops.fleets.supervisord.FLEET_METRICS_PORTS).
PORT_OFFSETS = {"dev": 0, "durable": 2000, "test": 10000, "faults": 20000, "secure": 22000}
PLAINTEXT, SASL_SSL = "plaintext", "sasl_ssl"
SECURITIES = (PLAINTEXT, SASL_SSL)


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

    @property
    def tls_dir(self) -> Path:
        return self.root / "tls"

    def saved_env(self) -> dict[str, str]:
        """The variables the last `up` wrote to stack.env (empty before the first)."""
        if not self.env_file.exists():
            return {}
        return dict(line.split("=", 1) for line in shlex.split(self.env_file.read_text()))

    def postgres_password(self) -> str | None:
        """The password PostgreSQL's superuser was given, as stack.env keeps it."""
        url = self.saved_env().get("DATABASE_URL")
        password = urlsplit(url).password if url else None
        return unquote(password) if password else None

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
    def ai_gateway_port(self) -> int:
        return 4000 + self.offset

    @property
    def airflow_port(self) -> int:
        return 8080 + self.offset

    @property
    def spark_master_port(self) -> int:
        return 7077 + self.offset

    @property
    def spark_connect_port(self) -> int:
        """The stack's Spark Connect server (Spark's default 15002 would put the offset stacks'
        in the ephemeral range)."""
        return 7078 + self.offset

    @property
    def spark_master_ui_port(self) -> int:
        return 8180 + self.offset

    @property
    def spark_worker_ui_port(self) -> int:
        return 8181 + self.offset

    def bootstrap_servers(self, brokers: int) -> str:
        return ",".join(f"127.0.0.1:{self.kafka_port(i)}" for i in range(1, brokers + 1))

    def database_url(self, database: str = "pipeline", password: str | None = None) -> str:
        """The libpq URL of one of the stack's databases as the superuser, with the stack's
        password (the one in stack.env) unless one is given."""
        password = password or self.postgres_password()
        user = f"postgres:{quote(password, safe='')}" if password else "postgres"
        return f"postgresql://{user}@127.0.0.1:{self.postgres_port}/{database}"


def current() -> Layout:
    """The stack named by STACK (default `dev`)."""
    return Layout(os.environ.get("STACK", "dev"))


def security() -> str:
    """How `up` secures the stack: SECURITY, `plaintext` (default) or `sasl_ssl`."""
    value = os.environ.get("SECURITY") or PLAINTEXT
    if value not in SECURITIES:
        raise SystemExit(f"unknown SECURITY={value!r}; known: {', '.join(SECURITIES)}")
    return value


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


def chosen(variable: str, modes: Sequence[str]) -> str:
    """A stack option from the environment (`SPARK`, `GATEWAY`): one of `modes`, the first by
    default; anything else stops the command naming what is known."""
    value = os.environ.get(variable) or modes[0]
    if value not in modes:
        raise SystemExit(f"unknown {variable}={value!r}; known: {', '.join(modes)}")
    return value
