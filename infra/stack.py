"""Start, inspect and stop the local stack: Kafka (KRaft), PostgreSQL, the AI service stand-in,
the Airflow metadata database and supervisord (which runs the deployed consumer fleets).

    python -m infra.stack up [--brokers 3]   # idempotent; writes .local/<stack>/stack.env
    python -m infra.stack down
    python -m infra.stack status
    python -m infra.stack stop-broker 3      # for failure tests on the cluster
    python -m infra.stack start-broker 3

STACK=test selects the test stack (own folder, ports +10000). SECURITY=sasl_ssl starts the stack
secured: Kafka only over SASL_SSL with a SCRAM user per role and ACLs enforced (see
infra/kafka_cluster.py). Every stack's PostgreSQL requires its superuser's password.
SPARK=cluster also starts a Spark standalone master and worker (infra/spark_cluster.py) and points
`spark_default` at it; every stack writes a Spark configuration folder (SPARK_CONF_DIR) and runs a
Spark Connect server on its master (infra/spark_connect.py, SPARK_CONNECT_URL and the
`spark_connect_default` connection), where the DAGs' analyses run.
GATEWAY=litellm also starts LiteLLM's proxy in front of the AI stand-in (infra/ai_gateway.py), its
URL and master key in stack.env (AI_GATEWAY_URL, AI_GATEWAY_KEY) and the `ai_gateway` connection.

The addresses of the running services, and the credentials to reach them, are written as shell
assignments to the stack's `stack.env` (owner-only) and copied to `.local/stack.env` for the dev
stack, so any shell can `source` them. The passwords are generated at the stack's first start and
live there only: each `up` reads them back, since the SCRAM users and the PostgreSQL cluster keep
the passwords they were created with.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from host import supervisor
from host.processes import alive, spawn, terminate
from infra import ai_gateway, airflow_ui, kafka_cluster, postgres_server, spark_cluster, spark_connect, tls
from infra.layout import (
    PLAINTEXT,
    REPO,
    SASL_SSL,
    Layout,
    current,
    port_in_use,
    security,
    wait_for_port,
)
from infra.migrate import migrate
from infra.stack_env import Credentials, environment, write_env
from infra.supervisor import stack_paths


def load_state(layout: Layout) -> dict[str, Any]:
    """The stack's state file as its JSON holds it (StackState's fields), empty before a start."""
    if layout.state_file.exists():
        return json.loads(layout.state_file.read_text())
    return {}


def save_state(layout: Layout, state: Mapping[str, Any]) -> None:
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.state_file.write_text(json.dumps(state, indent=2))


@dataclass(frozen=True)
class ConnectServer:
    """The Spark Connect server's process and the master it runs on."""

    pid: int
    master: str


@dataclass
class StackState:
    """What a stack's `up` started, kept between commands in its state file: the cluster's shape
    and id (its KRaft storage is formatted for them) and each process's id (None or empty: not
    started). `brokers` 0: the stack never started, or its storage is to be formatted anew."""

    brokers: int = 0
    security: str = PLAINTEXT
    cluster_id: str | None = None
    kafka: dict[int, int] = field(default_factory=dict)  # node -> pid
    ai_service: int | None = None
    gateway: int | None = None
    spark: dict[str, int] = field(default_factory=dict)  # master and worker -> pid
    spark_connect: ConnectServer | None = None

    @classmethod
    def load(cls, layout: Layout) -> StackState:
        data = load_state(layout)
        connect = data.get("spark_connect")
        return cls(data.get("brokers", 0), data.get("security", PLAINTEXT), data.get("cluster_id"),
                   {int(node): pid for node, pid in data.get("kafka", {}).items()},
                   data.get("ai_service"), data.get("gateway"), dict(data.get("spark") or {}),
                   ConnectServer(connect["pid"], connect["master"]) if connect else None)

    def save(self, layout: Layout) -> None:
        save_state(layout, {**asdict(self), "kafka": {str(node): pid for node, pid in self.kafka.items()}})


def running(state: StackState) -> bool:
    return any(alive(pid) for pid in state.kafka.values())


def start_ai_service(layout: Layout) -> int:
    """The AI stand-in at real scale (a run changes the scale through PUT /v1/config)."""
    cmd = [sys.executable, "-m", "consumers.stand_in", "--port", str(layout.ai_service_port)]
    pid = spawn(cmd, layout.root / "ai-service.log", cwd=REPO)
    if not wait_for_port(layout.ai_service_port, 30):
        raise RuntimeError(f"AI service did not start: see {layout.root / 'ai-service.log'}")
    return pid


def ports(layout: Layout, brokers: int, spark: str = spark_cluster.LOCAL,
          gateway: str = ai_gateway.NONE) -> dict[str, int]:
    """Every port the stack will listen on, named for error messages."""
    named = {"PostgreSQL": layout.postgres_port, "AI service": layout.ai_service_port,
             "Spark Connect": layout.spark_connect_port}
    if gateway == ai_gateway.LITELLM:
        named["AI gateway"] = layout.ai_gateway_port
    if spark == spark_cluster.CLUSTER:
        named.update({"Spark master": layout.spark_master_port,
                      "Spark master UI": layout.spark_master_ui_port,
                      "Spark worker UI": layout.spark_worker_ui_port})
    for node in range(1, brokers + 1):
        named[f"Kafka broker {node}"] = layout.kafka_port(node)
        named[f"Kafka controller {node}"] = layout.controller_port(node)
    return named


def check_ports_free(layout: Layout, brokers: int, spark: str, gateway: str) -> None:
    ours = {layout.postgres_port} if postgres_server.running(layout) else set()
    taken = [f"{name} port {port}" for name, port in ports(layout, brokers, spark, gateway).items()
             if port not in ours and port_in_use(port)]
    if taken:
        raise SystemExit("cannot start the stack, already in use on 127.0.0.1: "
                         + ", ".join(taken) + " (stop what listens there or use STACK=test)")


def airflow_db_prepare(layout: Layout, env: dict[str, str]) -> None:
    """Create or upgrade the Airflow metadata schema in the stack's PostgreSQL, and write the DAGs
    into it: the first runs (a UI trigger, `airflow dags test`) find them there, where two started
    at once on a new database both inserted the same DAG and one failed (UniqueViolation)."""
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    airflow = Path(sys.executable).parent / "airflow"
    for command in (["db", "migrate"], ["dags", "reserialize"]):
        result = subprocess.run([str(airflow), *command], env={**os.environ, **env},
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(command)} failed:\n"
                               f"{result.stdout[-3000:]}{result.stderr[-3000:]}")


def ensure_spark(layout: Layout, state: StackState, spark: str, token: str | None) -> None:
    """Write the stack's Spark configuration; start or stop the standalone cluster to match; run
    the Connect server on the stack's master, started again when that master is new."""
    spark_cluster.write_conf(layout, spark)
    master = spark_cluster.master_url(layout, spark)
    connect = state.spark_connect
    up_now = spark_cluster.running(state.spark, layout)
    restart = (connect is None or connect.master != master
               or (spark == spark_cluster.CLUSTER and not up_now))
    if restart:
        spark_connect.stop(connect.pid if connect else None)
    if spark == spark_cluster.CLUSTER and not up_now:
        print(f"starting a Spark standalone master and worker on {master}")
        spark_cluster.stop(state.spark)  # whichever half survived
        state.spark = spark_cluster.start(layout)
    elif spark == spark_cluster.LOCAL and state.spark:
        spark_cluster.stop(state.spark)
        state.spark = {}
    if token and (restart or not alive(connect.pid if connect else None)):
        print(f"starting a Spark Connect server on 127.0.0.1:{layout.spark_connect_port} ({master})")
        state.spark_connect = ConnectServer(spark_connect.start(layout, master, token), master)
    state.save(layout)


def ensure_gateway(layout: Layout, state: StackState, gateway: str, key: str | None) -> None:
    """Start LiteLLM's proxy in front of the stand-in when asked and not running (again, should it
    have died, as the stand-in is), stop it when not asked."""
    if gateway == ai_gateway.LITELLM and key is not None and not alive(state.gateway):
        print(f"starting LiteLLM's proxy on 127.0.0.1:{layout.ai_gateway_port} in front of the AI stand-in")
        state.gateway = ai_gateway.start(ai_gateway.folder(layout), layout.ai_gateway_port,
                                         f"http://127.0.0.1:{layout.ai_service_port}", key)
    elif gateway == ai_gateway.NONE and state.gateway:
        terminate(state.gateway, grace_s=10)
        state.gateway = None
    state.save(layout)


def up(layout: Layout, brokers: int, security: str, spark: str, gateway: str) -> None:
    """Start what of the stack is not running, the same steps whether it runs or not. A stack
    that runs keeps its shape; one that does not is checked for taken ports first, and its
    KRaft storage is formatted anew for another shape, security or SCRAM passwords."""
    state = StackState.load(layout)
    saved = Credentials.saved(layout)
    credentials = saved.completed(security, gateway)
    resumed = running(state)
    if resumed:
        if state.brokers != brokers:
            raise SystemExit(f"the {layout.name} stack already runs {state.brokers} broker(s); "
                             "`make down` first to change the broker count")
        if state.security != security:
            raise SystemExit(f"the {layout.name} stack already runs {state.security}; "
                             f"`make down` first to start it {security}")
    else:
        check_ports_free(layout, brokers, spark, gateway)
        layout.root.mkdir(parents=True, exist_ok=True)
        changed = bool(state.brokers) and (state.brokers, state.security) != (brokers, security)
        fresh_storage = changed or credentials.kafka != saved.kafka
        for directory in (kafka_cluster.node_dir(layout, node) for node in range(1, 4)):
            if fresh_storage and directory.exists():
                shutil.rmtree(directory)
        # Nothing of it runs: only the cluster's id is kept, for the storage formatted with it.
        state = StackState(brokers, security, None if fresh_storage else state.cluster_id)
    # The passwords are kept before any server is given them.
    env = environment(layout, brokers, security, credentials, spark)
    write_env(layout, env)

    if not postgres_server.running(layout):
        print(f"starting PostgreSQL on 127.0.0.1:{layout.postgres_port}")
    postgres_server.init(layout, credentials.postgres)
    postgres_server.start(layout)
    postgres_server.require_password(layout, credentials.postgres)
    migrate(layout.database_url())  # on a running stack: the migrations added since it started
    # Airflow's metadata database needs PostgreSQL only, so a new stack's is prepared while the
    # rest starts, and the brokers' storage is formatted side by side: each mostly waits on a
    # process starting.
    with ThreadPoolExecutor() as pool:
        airflow_ready = None if resumed else pool.submit(airflow_db_prepare, layout, env)
        if airflow_ready is not None:
            print("preparing the Airflow metadata database")
        start_services(layout, state, credentials, spark, gateway, pool)
        if airflow_ready is not None:
            airflow_ready.result()
    print(f"{layout.name} stack already running" if resumed
          else f"stack {layout.name} up; addresses and credentials in {layout.env_file}")


def start_services(layout: Layout, state: StackState, credentials: Credentials, spark: str,
                   gateway: str, pool: ThreadPoolExecutor) -> None:
    """The brokers not running (their storage formatted on `pool`), the stand-in, the gateway if
    asked, supervisord and Spark, in that order; each only when it does not run."""
    stopped = [node for node in range(1, state.brokers + 1) if not alive(state.kafka.get(node))]
    if stopped:
        print(f"starting {len(stopped)} Kafka broker(s) of {layout.bootstrap_servers(state.brokers)} "
              f"({state.security})")
        secured = (kafka_cluster.Secured(credentials.kafka, tls.ensure(layout.tls_dir))
                   if state.security == SASL_SSL else None)
        state.cluster_id = state.cluster_id or kafka_cluster.new_cluster_id()
        for formatted in [pool.submit(kafka_cluster.format_storage, layout, node, state.brokers,
                                      state.cluster_id, secured) for node in stopped]:
            formatted.result()
        state.kafka.update({node: kafka_cluster.start_node(layout, node) for node in stopped})
        state.save(layout)
        kafka_cluster.wait_registered(layout, state.kafka, state.brokers)

    if not alive(state.ai_service):
        print(f"starting the AI service stand-in on 127.0.0.1:{layout.ai_service_port}")
        state.ai_service = start_ai_service(layout)
        state.save(layout)
    ensure_gateway(layout, state, gateway, credentials.gateway)

    paths = stack_paths(layout)
    if not supervisor.Client(paths).alive():
        print(f"starting supervisord ({paths.socket}); deployed fleets start again")
    supervisor.start(paths)

    ensure_spark(layout, state, spark, credentials.spark_connect)


def down(layout: Layout) -> None:
    state = StackState.load(layout)
    # The gateway's port is checked after the stop only when it ran: 4000 is a common port.
    gateway = ai_gateway.LITELLM if state.gateway else ai_gateway.NONE
    # First, while Kafka runs: an Airflow left by an interrupted run, whose tasks talk to the
    # stack; the fleets finish their work, commit and leave their groups.
    airflow_ui.stop(layout)
    supervisor.shutdown(stack_paths(layout))
    terminate(state.gateway, state.ai_service, grace_s=10)
    ai_gateway.stop_every(layout)  # a test's proxy on the stack's gateway port, if one is left
    spark_connect.stop(state.spark_connect.pid if state.spark_connect else None)  # before its master
    spark_cluster.stop(state.spark)
    kafka_cluster.stop_nodes(*state.kafka.values())
    postgres_server.stop(layout)
    if layout.state_file.exists():  # nothing runs; the shape stays, its storage formatted for it
        StackState(state.brokers, state.security, state.cluster_id).save(layout)
    left = [f"{name} port {port}" for name, port
            in ports(layout, state.brokers or 3, spark_cluster.CLUSTER, gateway).items()
            if port_in_use(port)]
    if left:
        raise SystemExit("still listening after stop: " + ", ".join(left))
    print(f"stack {layout.name} stopped")


@contextlib.contextmanager
def started(layout: Layout, brokers: int, security: str, spark: str, gateway: str) -> Iterator[None]:
    """The stack up for the block: started here and stopped after it, unless it was running
    already (then it is left as it was). For a stack that only some work needs, so that its
    idle brokers and JVMs do not share the cores with everything else."""
    was_running = running(StackState.load(layout))
    up(layout, brokers, security, spark, gateway)
    try:
        yield
    finally:
        if not was_running:
            down(layout)


def status(layout: Layout) -> int:
    state = StackState.load(layout)
    for node, pid in sorted(state.kafka.items()):
        print(f"kafka node {node}: pid {pid} {'up' if alive(pid) else 'down'}")
    pg = port_in_use(layout.postgres_port)
    print(f"postgres: {'up' if pg else 'down'} on {layout.postgres_port}")
    print(f"AI service: {'up' if alive(state.ai_service) else 'down'} on {layout.ai_service_port}")
    if state.gateway:
        print(f"AI gateway (LiteLLM): {'up' if alive(state.gateway) else 'down'} on "
              f"{layout.ai_gateway_port}, log {ai_gateway.log_file(ai_gateway.folder(layout))}")
    if state.spark:
        workers = spark_cluster.status(layout).get("workers", [])
        print(f"Spark master: {'up' if spark_cluster.running(state.spark, layout) else 'down'} on "
              f"{spark_cluster.master_url(layout, spark_cluster.CLUSTER)}, {len(workers)} worker(s), "
              f"status {spark_cluster.status_url(layout)}")
    connect = state.spark_connect
    if connect:
        print(f"Spark Connect: {'up' if alive(connect.pid) else 'down'} on "
              f"127.0.0.1:{layout.spark_connect_port} ({connect.master}), "
              f"log {spark_connect.log_file(layout)}")
    paths = stack_paths(layout)
    client = supervisor.Client(paths)
    supervising = client.alive()
    print(f"supervisord: {'up' if supervising else 'down'} on {paths.socket}")
    for program in client.programs() if supervising else []:
        print(f"  {program.name}: {program.state} pid {program.pid or '-'}")
    return 0 if running(state) and pg else 1


def stop_broker(layout: Layout, node: int) -> None:
    kafka_cluster.stop_nodes(StackState.load(layout).kafka.get(node))
    print(f"kafka node {node} stopped")


def restart_broker(layout: Layout, node: int) -> StackState:
    """A stopped broker started again, its pid kept in the stack's state (what `down` stops);
    the state as it is then. It has not registered with the cluster yet."""
    state = StackState.load(layout)
    if not alive(state.kafka.get(node)):
        state.kafka[node] = kafka_cluster.start_node(layout, node)
        state.save(layout)
    return state


def start_broker(layout: Layout, node: int) -> None:
    state = restart_broker(layout, node)
    kafka_cluster.wait_registered(layout, state.kafka, state.brokers)
    print(f"kafka node {node} running")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    up_cmd = sub.add_parser("up", help="start the stack (idempotent)")
    up_cmd.add_argument("--brokers", type=int, choices=(1, 3),
                        default=int(os.environ.get("BROKERS", "1")))
    sub.add_parser("down", help="stop every process of the stack")
    sub.add_parser("status", help="show what runs")
    for name in ("stop-broker", "start-broker"):
        sub.add_parser(name).add_argument("node", type=int)
    args = parser.parse_args()
    layout = current()
    if args.command == "up":
        up(layout, args.brokers, security(), spark_cluster.mode(), ai_gateway.mode())
    elif args.command == "down":
        down(layout)
    elif args.command == "status":
        sys.exit(status(layout))
    elif args.command == "stop-broker":
        stop_broker(layout, args.node)
    else:
        start_broker(layout, args.node)


if __name__ == "__main__":
    main()
