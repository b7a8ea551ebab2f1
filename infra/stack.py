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
import secrets
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from consumers.config.kafka_connection import KafkaAccess, KafkaConnection
from consumers.config.pipeline_spec import roles
from host import supervisor
from host.files import write_private
from host.processes import alive, spawn, terminate
from infra import ai_gateway, kafka_cluster, postgres_server, spark_cluster, spark_connect, tls
from infra.layout import (
    LOCAL,
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
from infra.supervisor import stack_paths
from spark.jars import resolved_jars


@dataclass(frozen=True, repr=False)
class Credentials:
    """The stack's passwords: PostgreSQL's superuser's, on a secured stack each Kafka
    principal's (`admin` and one per role, named like the role), with a gateway its master key,
    and the Spark Connect server's token."""

    postgres: str | None
    kafka: Mapping[str, str]
    gateway: str | None = None
    spark_connect: str | None = None

    @classmethod
    def saved(cls, layout: Layout) -> Credentials:
        """The passwords the stack's stack.env holds (none before the first start)."""
        access = KafkaAccess.from_environment(layout.saved_env())
        connections = [access.default, *access.roles.values()] if access else []
        connect_url = layout.saved_env().get("SPARK_CONNECT_URL")
        return cls(layout.postgres_password(),
                   {c.settings["sasl.username"]: c.settings["sasl.password"]
                    for c in connections if "sasl.username" in c.settings},
                   layout.saved_env().get("AI_GATEWAY_KEY"),
                   spark_connect.token_of(connect_url) if connect_url else None)

    def completed(self, security: str, gateway: str = ai_gateway.NONE) -> Credentials:
        """These passwords, with new ones for what `security` and `gateway` need and they lack
        (a stack without a gateway keeps no key for one)."""
        users = (kafka_cluster.ADMIN, *roles()) if security == SASL_SSL else ()
        key = (self.gateway or ai_gateway.new_key(new_password())) if gateway == ai_gateway.LITELLM else None
        return Credentials(self.postgres or new_password(),
                           {user: self.kafka.get(user) or new_password() for user in users}, key,
                           self.spark_connect or new_password())


def new_password() -> str:
    """A random password of URL-safe characters (none needs escaping in a URL, JAAS or shell)."""
    return secrets.token_urlsafe(24)


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


def kafka_access(layout: Layout, brokers: int, security: str, credentials: Credentials) -> KafkaAccess:
    """Who reaches the stack's Kafka as whom: on a secured stack the admin by default and each
    role as its own SCRAM user, over TLS checked against the stack's CA."""
    bootstrap = layout.bootstrap_servers(brokers)
    if security == PLAINTEXT:
        return KafkaAccess.plain(bootstrap)
    ca = tls.TlsFiles(layout.tls_dir).ca

    def connection(user: str) -> KafkaConnection:
        return KafkaConnection({"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL",
                                "sasl.mechanism": kafka_cluster.SCRAM, "sasl.username": user,
                                "sasl.password": credentials.kafka[user], "ssl.ca.location": str(ca)})

    return KafkaAccess(connection(kafka_cluster.ADMIN), {role: connection(role) for role in roles()})


def airflow_kafka_connections(access: KafkaAccess) -> dict[str, str]:
    """`kafka_default` as the default principal, `kafka_default_<role>` for each role that has
    its own, and `kafka_dead_letter_watch` (the default principal) for the dead-letter watcher."""
    default = {**access.default.settings, "group.id": "airflow", "auto.offset.reset": "earliest"}
    conns = {"AIRFLOW_CONN_KAFKA_DEFAULT": {"conn_type": "kafka", "extra": default}}
    # The dead-letter watcher's own group: its trigger commits only once an event is stored
    # (plugins/pipeline_ops/dead_letter_watch.py says why each setting).
    conns["AIRFLOW_CONN_KAFKA_DEAD_LETTER_WATCH"] = {"conn_type": "kafka", "extra": {
        **access.default.settings, "group.id": "dead_letter_triage", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 10000}}
    for role, conn in access.roles.items():
        conns[f"AIRFLOW_CONN_KAFKA_DEFAULT_{role.upper()}"] = {"conn_type": "kafka",
                                                               "extra": dict(conn.settings)}
    return {name: json.dumps(conn) for name, conn in conns.items()}


def spark_connection(layout: Layout, spark: str) -> dict:
    """`spark_default`: the standalone master in client deploy mode, or local[*]."""
    if spark == spark_cluster.CLUSTER:
        return {"conn_type": "spark", "host": "spark://127.0.0.1", "port": layout.spark_master_port,
                "extra": {"deploy-mode": "client"}}
    return {"conn_type": "spark", "host": "local[*]"}


def spark_connect_environment(layout: Layout, token: str | None) -> dict[str, str]:
    """The Connect server's URL, token included, and the `spark_connect_default` connection.
    Not PySpark's own SPARK_REMOTE: with it set, every session PySpark builds, spark-submit's
    included, would be a client of the server."""
    if token is None:
        return {}
    return {"SPARK_CONNECT_URL": spark_connect.url(layout, token),
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps(spark_connect.connection(layout, token))}


def gateway_environment(layout: Layout, key: str | None) -> dict[str, str]:
    """With a gateway (`key` its master key): its URL and key, and the `ai_gateway` connection
    (HTTP, the key as its password) for the endpoints of a spec that name it; the `llm`
    connection the LLM pipeline's models name goes through it too."""
    if key is None:
        return {}
    url = f"http://127.0.0.1:{layout.ai_gateway_port}"
    connection = {"conn_type": "http", "host": "127.0.0.1", "port": layout.ai_gateway_port, "password": key}
    return {"AI_GATEWAY_URL": url, "AI_GATEWAY_KEY": key, "AIRFLOW_CONN_AI_GATEWAY": json.dumps(connection),
            "AIRFLOW_CONN_LLM": json.dumps(connection)}


def environment(layout: Layout, brokers: int, security: str, credentials: Credentials,
                spark: str) -> dict[str, str]:
    """The stack's addresses and credentials, and the Airflow settings that point at them."""
    access = kafka_access(layout, brokers, security, credentials)
    database_url = layout.database_url(password=credentials.postgres)
    airflow_db = layout.database_url("airflow", credentials.postgres).replace(
        "postgresql://", "postgresql+psycopg2://")
    return {
        "STACK": layout.name,
        "SECURITY": security,
        "KAFKA_BROKERS": str(brokers),
        **access.environment(),  # KAFKA_CLIENT_CONFIG, KAFKA_BOOTSTRAP_SERVERS, ..._<ROLE>
        "DATABASE_URL": database_url,
        "AI_SERVICE_URL": f"http://127.0.0.1:{layout.ai_service_port}",
        "SUPERVISOR_URL": stack_paths(layout).url,
        "SPARK": spark,
        "SPARK_CONF_DIR": str(spark_cluster.conf_dir(layout)),
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
        **airflow_kafka_connections(access),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": database_url.replace("postgresql://", "postgres://"),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark_connection(layout, spark)),
        **spark_connect_environment(layout, credentials.spark_connect),
        "AIRFLOW_CONN_AI_SERVICE": f"http://127.0.0.1:{layout.ai_service_port}/?stand_in=true",
        # The OpenAI-compatible models the LLM pipeline names: the stand-in serves them, or the
        # gateway in front of it when there is one (below).
        "AIRFLOW_CONN_LLM": f"http://127.0.0.1:{layout.ai_service_port}/?stand_in=true",
        **gateway_environment(layout, credentials.gateway),
        "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}",
        # spark-submit and the fleet commands come from the project's environment.
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }


def write_env(layout: Layout, env: dict[str, str]) -> None:
    """stack.env, owner-only: it holds the stack's passwords."""
    text = "".join(f"{key}={shlex.quote(value)}\n" for key, value in env.items())
    write_private(layout.env_file, text)
    if layout.name == "dev":
        write_private(LOCAL / "stack.env", text)


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


def ensure_spark(layout: Layout, state: dict, spark: str, token: str | None) -> None:
    """Write the stack's Spark configuration; start or stop the standalone cluster to match; run
    the Connect server on the stack's master, started again when that master is new."""
    spark_cluster.write_conf(layout, spark)
    master = spark_cluster.master_url(layout, spark)
    connect = state.get("spark_connect") or {}
    pids = state.get("spark", {})
    up_now = spark_cluster.running(pids, layout)
    restart = connect.get("master") != master or (spark == spark_cluster.CLUSTER and not up_now)
    if restart:
        spark_connect.stop(connect.get("pid"))
    if spark == spark_cluster.CLUSTER and not up_now:
        print(f"starting a Spark standalone master and worker on {master}")
        spark_cluster.stop(pids)  # whichever half survived
        state["spark"] = spark_cluster.start(layout)
    elif spark == spark_cluster.LOCAL and pids:
        spark_cluster.stop(pids)
        state["spark"] = {}
    if token and (restart or not alive(connect.get("pid"))):
        print(f"starting a Spark Connect server on 127.0.0.1:{layout.spark_connect_port} ({master})")
        state["spark_connect"] = {"pid": spark_connect.start(layout, master, token), "master": master}
    save_state(layout, state)


def ensure_gateway(layout: Layout, state: dict, gateway: str, key: str | None) -> None:
    """Start LiteLLM's proxy in front of the stand-in when asked and not running (again, should it
    have died, as the stand-in is), stop it when not asked."""
    pid = state.get("gateway")
    if gateway == ai_gateway.LITELLM and not alive(pid):
        print(f"starting LiteLLM's proxy on 127.0.0.1:{layout.ai_gateway_port} in front of the AI stand-in")
        state["gateway"] = ai_gateway.start(ai_gateway.folder(layout), layout.ai_gateway_port,
                                            f"http://127.0.0.1:{layout.ai_service_port}", key)
    elif gateway == ai_gateway.NONE and pid:
        terminate(pid, grace_s=10)
        state["gateway"] = None
    save_state(layout, state)


def up(layout: Layout, brokers: int, security: str, spark: str, gateway: str) -> None:
    state = load_state(layout)
    saved = Credentials.saved(layout)
    credentials = saved.completed(security, gateway)
    if running(state):
        if state["brokers"] != brokers:
            raise SystemExit(f"the {layout.name} stack already runs {state['brokers']} broker(s); "
                             "`make down` first to change the broker count")
        if state.get("security", PLAINTEXT) != security:
            raise SystemExit(f"the {layout.name} stack already runs {state.get('security', PLAINTEXT)}; "
                             f"`make down` first to start it {security}")
        write_env(layout, environment(layout, brokers, security, credentials, spark))
        postgres_server.require_password(layout, credentials.postgres)
        for node in map(int, state["kafka"]):
            if not alive(state["kafka"][str(node)]):
                state["kafka"][str(node)] = kafka_cluster.start_node(layout, node)
        if not alive(state.get("ai_service")):
            state["ai_service"] = start_ai_service(layout)
        save_state(layout, state)
        ensure_gateway(layout, state, gateway, credentials.gateway)
        migrate(layout.database_url())  # migrations added since the stack started
        supervisor.start(stack_paths(layout))
        ensure_spark(layout, state, spark, credentials.spark_connect)
        print(f"{layout.name} stack already running")
        return
    check_ports_free(layout, brokers, spark, gateway)
    layout.root.mkdir(parents=True, exist_ok=True)
    changed = bool(state) and (state["brokers"], state.get("security", PLAINTEXT)) != (brokers, security)
    if changed or credentials.kafka != saved.kafka:
        # A different cluster shape or security, or new SCRAM passwords, need fresh KRaft storage.
        for node in range(1, 4):
            subprocess.run(["rm", "-rf", str(kafka_cluster.node_dir(layout, node))], check=True)
        state = {}
    # The passwords are kept before any server is given them.
    env = environment(layout, brokers, security, credentials, spark)
    write_env(layout, env)

    print(f"starting PostgreSQL on 127.0.0.1:{layout.postgres_port}")
    postgres_server.init(layout, credentials.postgres)
    postgres_server.start(layout)
    postgres_server.require_password(layout, credentials.postgres)
    migrate(layout.database_url())
    # Airflow's metadata database needs PostgreSQL only, so it is prepared while the rest starts,
    # and the brokers' storage is formatted side by side: each mostly waits on a process starting.
    with ThreadPoolExecutor() as pool:
        print("preparing the Airflow metadata database")
        airflow_ready = pool.submit(airflow_db_prepare, layout, env)
        start_services(layout, brokers, security, credentials, spark, gateway, state, pool)
        airflow_ready.result()
    print(f"stack {layout.name} up; addresses and credentials in {layout.env_file}")


def start_services(layout: Layout, brokers: int, security: str, credentials: Credentials, spark: str,
               gateway: str, state: dict, pool: ThreadPoolExecutor) -> None:
    """The brokers (their storage formatted on `pool`), the stand-in, the gateway if asked,
    supervisord and Spark, in that order."""
    print(f"starting {brokers} Kafka broker(s) on {layout.bootstrap_servers(brokers)} ({security})")
    secured = (kafka_cluster.Secured(credentials.kafka, tls.ensure(layout.tls_dir))
               if security == SASL_SSL else None)
    cluster_id = state.get("cluster_id") or kafka_cluster.new_cluster_id()
    nodes = range(1, brokers + 1)
    for formatted in [pool.submit(kafka_cluster.format_storage, layout, node, brokers, cluster_id, secured)
                      for node in nodes]:
        formatted.result()
    pids = {node: kafka_cluster.start_node(layout, node) for node in nodes}
    state.clear()
    state.update({"brokers": brokers, "security": security, "cluster_id": cluster_id, "kafka": pids})
    save_state(layout, state)
    kafka_cluster.wait_registered(layout, pids, brokers)

    print(f"starting the AI service stand-in on 127.0.0.1:{layout.ai_service_port}")
    state["ai_service"] = start_ai_service(layout)
    save_state(layout, state)
    ensure_gateway(layout, state, gateway, credentials.gateway)

    paths = stack_paths(layout)
    print(f"starting supervisord ({paths.socket}); deployed fleets start again")
    supervisor.start(paths)

    ensure_spark(layout, state, spark, credentials.spark_connect)


def down(layout: Layout) -> None:
    state = load_state(layout)
    # The gateway's port is checked after the stop only when it ran: 4000 is a common port.
    gateway = ai_gateway.LITELLM if state.get("gateway") else ai_gateway.NONE
    # First, while Kafka runs: the fleets finish their work, commit and leave their groups.
    supervisor.shutdown(stack_paths(layout))
    terminate(state.get("gateway"), state.get("ai_service"), grace_s=10)
    spark_connect.stop((state.get("spark_connect") or {}).get("pid"))  # before its master
    spark_cluster.stop(state.get("spark", {}))
    kafka_cluster.stop_nodes(*state.get("kafka", {}).values())
    postgres_server.stop(layout)
    if state:
        state["kafka"], state["ai_service"], state["gateway"], state["spark"] = {}, None, None, {}
        state["spark_connect"] = None
        save_state(layout, state)
    left = [f"{name} port {port}" for name, port
            in ports(layout, state.get("brokers", 3), spark_cluster.CLUSTER, gateway).items()
            if port_in_use(port)]
    if left:
        raise SystemExit("still listening after stop: " + ", ".join(left))
    print(f"stack {layout.name} stopped")


@contextlib.contextmanager
def started(layout: Layout, brokers: int, security: str, spark: str, gateway: str) -> Iterator[None]:
    """The stack up for the block: started here and stopped after it, unless it was running
    already (then it is left as it was). For a stack that only some work needs, so that its
    idle brokers and JVMs do not share the cores with everything else."""
    was_running = running(load_state(layout))
    up(layout, brokers, security, spark, gateway)
    try:
        yield
    finally:
        if not was_running:
            down(layout)


def status(layout: Layout) -> int:
    state = load_state(layout)
    for node, pid in sorted(state.get("kafka", {}).items()):
        print(f"kafka node {node}: pid {pid} {'up' if alive(pid) else 'down'}")
    pg = port_in_use(layout.postgres_port)
    print(f"postgres: {'up' if pg else 'down'} on {layout.postgres_port}")
    print(f"AI service: {'up' if alive(state.get('ai_service')) else 'down'} on {layout.ai_service_port}")
    if state.get("gateway"):
        print(f"AI gateway (LiteLLM): {'up' if alive(state['gateway']) else 'down'} on "
              f"{layout.ai_gateway_port}, log {ai_gateway.log_file(ai_gateway.folder(layout))}")
    if state.get("spark"):
        workers = spark_cluster.status(layout).get("workers", [])
        print(f"Spark master: {'up' if spark_cluster.running(state['spark'], layout) else 'down'} on "
              f"{spark_cluster.master_url(layout, spark_cluster.CLUSTER)}, {len(workers)} worker(s), "
              f"status {spark_cluster.status_url(layout)}")
    connect = state.get("spark_connect") or {}
    if connect:
        print(f"Spark Connect: {'up' if alive(connect['pid']) else 'down'} on "
              f"127.0.0.1:{layout.spark_connect_port} ({connect['master']}), "
              f"log {spark_connect.log_file(layout)}")
    paths = stack_paths(layout)
    client = supervisor.Client(paths)
    supervising = client.alive()
    print(f"supervisord: {'up' if supervising else 'down'} on {paths.socket}")
    for program in client.programs() if supervising else []:
        print(f"  {program.name}: {program.state} pid {program.pid or '-'}")
    return 0 if running(state) and pg else 1


def stop_broker(layout: Layout, node: int) -> None:
    state = load_state(layout)
    kafka_cluster.stop_nodes(state["kafka"].get(str(node)))
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
