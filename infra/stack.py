"""Start, inspect and stop the local stack: Kafka (KRaft), PostgreSQL, the AI service stand-in,
the Airflow metadata database and supervisord (which runs the deployed consumer fleets).

    python -m infra.stack up [--brokers 3]   # idempotent; writes .local/<stack>/stack.env
    python -m infra.stack down
    python -m infra.stack status
    python -m infra.stack stop-broker 3      # for failure tests on the cluster
    python -m infra.stack start-broker 3

STACK=test selects the test stack (own folder, ports +10000). The addresses of the running
services are written as shell assignments to the stack's `stack.env` and copied to
`.local/stack.env` for the dev stack, so any shell can `source` them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from infra import kafka_cluster, postgres_server, supervisor
from infra.layout import LOCAL, REPO, Layout, current, port_in_use, wait_for_port
from infra.migrate import migrate
from infra.processes import alive, spawn, terminate
from spark.jars import resolved_jars


def load_state(layout: Layout) -> dict:
    if layout.state_file.exists():
        return json.loads(layout.state_file.read_text())
    return {}


def save_state(layout: Layout, state: dict) -> None:
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.state_file.write_text(json.dumps(state, indent=2))


def running(state: dict) -> bool:
    return any(alive(pid) for pid in state.get("kafka", {}).values())


def start_ai_service(layout: Layout) -> int:
    """The AI stand-in at real scale (a run changes the scale through PUT /v1/config)."""
    cmd = [sys.executable, "-m", "consumers.ai_service", "--port", str(layout.ai_service_port),
           "--time-scale", os.environ.get("AI_TIME_SCALE", "1.0")]
    pid = spawn(cmd, layout.root / "ai-service.log", cwd=REPO)
    if not wait_for_port(layout.ai_service_port, 30):
        raise RuntimeError(f"AI service did not start: see {layout.root / 'ai-service.log'}")
    return pid


def ports(layout: Layout, brokers: int) -> dict[str, int]:
    """Every port the stack will listen on, named for error messages."""
    named = {"PostgreSQL": layout.postgres_port, "AI service": layout.ai_service_port}
    for node in range(1, brokers + 1):
        named[f"Kafka broker {node}"] = layout.kafka_port(node)
        named[f"Kafka controller {node}"] = layout.controller_port(node)
    return named


def check_ports_free(layout: Layout, brokers: int) -> None:
    ours = {layout.postgres_port} if postgres_server.running(layout) else set()
    taken = [f"{name} port {port}" for name, port in ports(layout, brokers).items()
             if port not in ours and port_in_use(port)]
    if taken:
        raise SystemExit("cannot start the stack, already in use on 127.0.0.1: "
                         + ", ".join(taken) + " (stop what listens there or use STACK=test)")


def environment(layout: Layout, brokers: int) -> dict[str, str]:
    """The stack's addresses and the Airflow settings that point at them."""
    bootstrap = layout.bootstrap_servers(brokers)
    airflow_db = layout.database_url("airflow").replace("postgresql://", "postgresql+psycopg2://")
    kafka_conn = {"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap,
                                                   "group.id": "airflow",
                                                   "auto.offset.reset": "earliest"}}
    return {
        "STACK": layout.name,
        "KAFKA_BROKERS": str(brokers),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "DATABASE_URL": layout.database_url(),
        "AI_SERVICE_URL": f"http://127.0.0.1:{layout.ai_service_port}",
        "AI_CHECK_URL": f"http://127.0.0.1:{layout.ai_service_port}/v1/check",
        "AI_GENERATE_URL": f"http://127.0.0.1:{layout.ai_service_port}/v1/generate",
        "SUPERVISOR_URL": supervisor.stack_paths(layout).url,
        "SPARK_MASTER": "local[*]",
        "SPARK_JARS": resolved_jars(),
        "AIRFLOW_HOME": str(layout.root / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE":
            str(layout.root / "airflow" / "passwords.json"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db,
        "AIRFLOW__API__PORT": str(layout.airflow_port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{layout.airflow_port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL":
            f"http://127.0.0.1:{layout.airflow_port}/execution/",
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(kafka_conn),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": layout.database_url().replace("postgresql://", "postgres://"),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "AIRFLOW_CONN_AI_SERVICE": f"http://127.0.0.1:{layout.ai_service_port}/?stand_in=true",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}",
        # spark-submit and the fleet commands come from the project's environment.
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }


def write_env(layout: Layout, env: dict[str, str]) -> None:
    text = "".join(f"{key}={shlex.quote(value)}\n" for key, value in env.items())
    layout.env_file.write_text(text)
    if layout.name == "dev":
        (LOCAL / "stack.env").write_text(text)


def airflow_db_migrate(layout: Layout, env: dict[str, str]) -> None:
    """Create or upgrade the Airflow metadata schema in the stack's PostgreSQL."""
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run([str(airflow), "db", "migrate"], env={**os.environ, **env},
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")


def up(layout: Layout, brokers: int) -> None:
    state = load_state(layout)
    if running(state):
        if state["brokers"] != brokers:
            raise SystemExit(f"the {layout.name} stack already runs {state['brokers']} broker(s); "
                             "`make down` first to change the broker count")
        for node in map(int, state["kafka"]):
            if not alive(state["kafka"][str(node)]):
                state["kafka"][str(node)] = kafka_cluster.start_node(layout, node)
        if not alive(state.get("ai_service")):
            state["ai_service"] = start_ai_service(layout)
        save_state(layout, state)
        migrate(layout.database_url())  # migrations added since the stack started
        supervisor.start(supervisor.stack_paths(layout))
        print(f"{layout.name} stack already running")
        write_env(layout, environment(layout, brokers))
        return
    check_ports_free(layout, brokers)
    layout.root.mkdir(parents=True, exist_ok=True)
    if state.get("brokers") not in (None, brokers):
        # A different cluster shape needs fresh KRaft storage.
        for node in range(1, 4):
            subprocess.run(["rm", "-rf", str(kafka_cluster.node_dir(layout, node))], check=True)
        state = {}

    print(f"starting PostgreSQL on 127.0.0.1:{layout.postgres_port}")
    postgres_server.init(layout)
    postgres_server.start(layout)
    migrate(layout.database_url())

    print(f"starting {brokers} Kafka broker(s) on {layout.bootstrap_servers(brokers)}")
    cluster_id = state.get("cluster_id") or kafka_cluster.new_cluster_id()
    pids = {}
    for node in range(1, brokers + 1):
        kafka_cluster.format_storage(layout, node, brokers, cluster_id)
        pids[node] = kafka_cluster.start_node(layout, node)
    state = {"brokers": brokers, "cluster_id": cluster_id, "kafka": pids}
    save_state(layout, state)
    kafka_cluster.wait_registered(layout, pids, brokers)

    print(f"starting the AI service stand-in on 127.0.0.1:{layout.ai_service_port}")
    state["ai_service"] = start_ai_service(layout)
    save_state(layout, state)

    paths = supervisor.stack_paths(layout)
    print(f"starting supervisord ({paths.socket}); deployed fleets start again")
    supervisor.start(paths)

    env = environment(layout, brokers)
    print("preparing the Airflow metadata database")
    airflow_db_migrate(layout, env)
    write_env(layout, env)
    print(f"stack {layout.name} up; addresses in {layout.env_file}")


def down(layout: Layout) -> None:
    state = load_state(layout)
    # First, while Kafka runs: the fleets finish their work, commit and leave their groups.
    supervisor.shutdown(supervisor.stack_paths(layout))
    terminate(state.get("ai_service"), grace_s=10)
    for pid in state.get("kafka", {}).values():
        kafka_cluster.stop_node(pid)
    postgres_server.stop(layout)
    if state:
        state["kafka"], state["ai_service"] = {}, None
        save_state(layout, state)
    left = [f"{name} port {port}" for name, port in ports(layout, state.get("brokers", 3)).items()
            if port_in_use(port)]
    if left:
        raise SystemExit("still listening after stop: " + ", ".join(left))
    print(f"stack {layout.name} stopped")


def status(layout: Layout) -> int:
    state = load_state(layout)
    for node, pid in sorted(state.get("kafka", {}).items()):
        print(f"kafka node {node}: pid {pid} {'up' if alive(pid) else 'down'}")
    pg = port_in_use(layout.postgres_port)
    print(f"postgres: {'up' if pg else 'down'} on {layout.postgres_port}")
    print(f"AI service: {'up' if alive(state.get('ai_service')) else 'down'} on {layout.ai_service_port}")
    paths = supervisor.stack_paths(layout)
    client = supervisor.Client(paths)
    supervising = client.alive()
    print(f"supervisord: {'up' if supervising else 'down'} on {paths.socket}")
    for program in client.programs() if supervising else []:
        print(f"  {program.name}: {program.state} pid {program.pid or '-'}")
    return 0 if running(state) and pg else 1


def stop_broker(layout: Layout, node: int) -> None:
    state = load_state(layout)
    kafka_cluster.stop_node(state["kafka"].get(str(node)))
    print(f"kafka node {node} stopped")


def start_broker(layout: Layout, node: int) -> None:
    state = load_state(layout)
    if not alive(state["kafka"].get(str(node))):
        state["kafka"][str(node)] = kafka_cluster.start_node(layout, node)
        save_state(layout, state)
    pids = {int(k): v for k, v in state["kafka"].items()}
    kafka_cluster.wait_registered(layout, pids, state["brokers"])
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
        up(layout, args.brokers)
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
