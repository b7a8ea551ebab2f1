"""Static checks of docker-compose.yaml.

The Docker path cannot be started where there is no Docker engine, so its wiring is checked by
reading the file: a mistake here (a missing dependency, an undeclared volume, a broker that
advertises the wrong port) would otherwise only show on someone else's machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.kafka_cluster import GROUP_SETTINGS
from infra.layout import REPO
from spark.jars import JARS_DIR

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
AIRFLOW_ENV: dict[str, str] = COMPOSE["x-airflow-common"]["environment"]

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message} and bare $VAR; `$$` is a literal `$`.
REFERENCE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_]\w*)(?P<modifier>[^}]*)\}|(?P<bare>[A-Za-z_]\w*))")
DEFAULTED = re.compile(r"\$\{[A-Za-z_]\w*:?-(?P<default>[^}]*)\}")


def strings(node: Any) -> list[str]:
    """Every string value in the parsed file: what Compose interpolates (comments are not)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in strings(value)]
    if isinstance(node, list):
        return [s for item in node for s in strings(item)]
    return []


def references() -> list[tuple[str, str]]:
    """(variable, modifier) for each distinct interpolation in the file."""
    found = set()
    for text in strings(COMPOSE):
        for match in REFERENCE.finditer(text.replace("$$", "")):
            found.add((match["braced"] or match["bare"], match["modifier"] or ""))
    return sorted(found)


def with_defaults(text: str) -> str:
    """The value Compose gives `text` when no variable is set."""
    return DEFAULTED.sub(lambda m: m["default"], str(text))


def dotenv_names() -> set[str]:
    """Names set in the project's .env, the one file Compose reads for interpolation."""
    path = ROOT / ".env"
    if not path.exists():
        return set()
    lines = (line.strip() for line in path.read_text().splitlines())
    return {line.split("=", 1)[0].removeprefix("export ").strip()
            for line in lines if "=" in line and not line.startswith("#")}


def dependencies() -> list[tuple[str, str]]:
    """(service, dependency) for every depends_on entry, in its list or mapping form."""
    return [(name, dep) for name, service in SERVICES.items() for dep in service.get("depends_on", [])]


def condition(service: str, dependency: str) -> str:
    deps = SERVICES[service]["depends_on"]
    if isinstance(deps, dict):
        return deps[dependency].get("condition", "service_started")
    return "service_started"


def cases(rows: list[tuple[Any, ...]], label: str) -> list[Any]:
    """pytest params named by `label` formatted with the row, e.g. `{0}->{1}`."""
    return [pytest.param(*row, id=label.format(*row)) for row in rows]


def mounts() -> list[tuple[str, str, str]]:
    """(service, kind, source) for each volume entry; kind is `bind` or `volume`."""
    found = []
    for name, service in SERVICES.items():
        for entry in service.get("volumes", []):
            if isinstance(entry, dict):
                source = entry.get("source", "")
                kind = entry.get("type", "volume")
            else:
                source = entry.split(":", 1)[0] if ":" in entry else ""
                kind = "bind" if source.startswith((".", "/", "~")) else "volume"
            if source:
                found.append((name, kind, source))
    return found


def builds() -> list[tuple[str, Path, Path]]:
    """(service, context, Dockerfile) for each service built from this repo."""
    found = []
    for name, service in SERVICES.items():
        build = service.get("build")
        if build is None:
            continue
        if isinstance(build, str):
            build = {"context": build}
        context = ROOT / build.get("context", ".")
        found.append((name, context, context / build.get("dockerfile", "Dockerfile")))
    return found


BROKERS = sorted(name for name, service in SERVICES.items()
                 if str(service.get("image", "")).startswith("apache/kafka:"))


def broker_env(name: str) -> dict[str, str]:
    return {key: with_defaults(value) for key, value in SERVICES[name]["environment"].items()}


def listener_ports(listeners: str) -> dict[str, int]:
    """{listener name: port} from a Kafka listeners string like `NAME://host:port,...`."""
    return {item.split("://")[0]: int(item.rsplit(":", 1)[1]) for item in listeners.split(",")}


def published(name: str) -> dict[int, int]:
    """{container port: host port} for the service's `ports`, with variable defaults applied."""
    mapping = {}
    for entry in SERVICES[name].get("ports", []):
        if isinstance(entry, dict):
            mapping[int(entry["target"])] = int(with_defaults(entry["published"]))
        else:
            *_, host, container = with_defaults(entry).split(":")
            mapping[int(container.split("/")[0])] = int(host)
    return mapping


@pytest.mark.parametrize(("service", "dependency"), cases(dependencies(), "{0}->{1}"))
def test_dependency_is_a_service(service: str, dependency: str) -> None:
    """Compose refuses to start anything when a depends_on names no service."""
    assert dependency in SERVICES, f"{service} depends on unknown service {dependency}"


@pytest.mark.parametrize(("service", "dependency"), cases(
    [d for d in dependencies() if d[1] in SERVICES and condition(*d) == "service_healthy"], "{0}->{1}"))
def test_waited_for_health_has_a_healthcheck(service: str, dependency: str) -> None:
    """Waiting on service_healthy for a service with no healthcheck fails at `up`, not before."""
    assert "healthcheck" in SERVICES[dependency], f"{service} waits for {dependency} to be healthy"


@pytest.mark.parametrize(("service", "volume"),
                         cases([(s, src) for s, kind, src in mounts() if kind == "volume"], "{0}:{1}"))
def test_named_volume_is_declared(service: str, volume: str) -> None:
    """An undeclared named volume is a Compose error."""
    assert volume in (COMPOSE.get("volumes") or {}), f"{service} uses undeclared volume {volume}"


@pytest.mark.parametrize(("variable", "modifier"), cases(references(), "{0}{1}"))
def test_variable_has_a_default(variable: str, modifier: str) -> None:
    """The stack must come up from a clean checkout with no .env file."""
    assert modifier.startswith((":-", "-")) or variable in dotenv_names(), \
        f"${{{variable}{modifier}}} has no default"


@pytest.mark.parametrize(("service", "source"),
                         cases([(s, src) for s, kind, src in mounts() if kind == "bind"], "{0}:{1}"))
def test_bind_mount_source_exists(service: str, source: str) -> None:
    """Docker would create a missing host path as an empty root-owned folder and mount that."""
    assert (ROOT / source).exists(), f"{service} mounts missing {source}"


@pytest.mark.parametrize(("service", "context", "dockerfile"), cases(builds(), "{0}"))
def test_dockerfile_exists(service: str, context: Path, dockerfile: Path) -> None:
    """A build must find its Dockerfile under its context."""
    assert dockerfile.is_file(), f"{service}: no {dockerfile.relative_to(ROOT)}"


@pytest.mark.parametrize(("service", "context", "dockerfile"),
                         cases([b for b in builds() if b[2].is_file()], "{0}"))
def test_dockerfile_copies_existing_files(service: str, context: Path, dockerfile: Path) -> None:
    """A COPY of a file missing from the context fails the build."""
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources = [w for w in words[1:-1] if not w.startswith("--")]
            missing = [s for s in sources if not (context / s).exists()]
            assert not missing, f"{service}: {dockerfile.name} copies missing {missing}"


def copied_from_stages(dockerfile: Path) -> list[str]:
    """Destinations of `COPY --from=<stage>` lines."""
    return [line.split()[-1] for line in dockerfile.read_text().splitlines()
            if line.startswith("COPY --from=")]


@pytest.mark.parametrize(("service", "context", "dockerfile"),
                         cases([b for b in builds() if b[2].is_file()], "{0}"))
def test_image_has_the_spark_jars_where_the_code_looks(service: str, context: Path, dockerfile: Path) -> None:
    """Spark jobs started from a container find the connector jars under the mounted repository."""
    mounts = dict(v.split(":")[:2] for v in SERVICES[service].get("volumes", []) if v.startswith("./"))
    if "./spark" not in mounts:
        pytest.skip(f"{service} runs no Spark job")
    container_repo = Path(mounts["./spark"]).parent
    expected = container_repo / JARS_DIR.relative_to(REPO)
    assert str(expected) in copied_from_stages(dockerfile), f"{service}: no jars copied to {expected}"


def test_three_brokers() -> None:
    """The replication defaults (3, min ISR 2) need three brokers."""
    assert len(BROKERS) == 3, BROKERS


def test_brokers_share_one_quorum() -> None:
    """Every node must list the same voters and cluster id, or the quorum never forms."""
    voters = {broker_env(b)["KAFKA_CONTROLLER_QUORUM_VOTERS"] for b in BROKERS}
    cluster_ids = {broker_env(b)["CLUSTER_ID"] for b in BROKERS}
    assert len(voters) == 1, voters
    assert len(cluster_ids) == 1, cluster_ids


@pytest.mark.parametrize("broker", BROKERS)
def test_broker_votes_under_its_own_id(broker: str) -> None:
    """A node whose id or address is not in the voter list cannot join the controller quorum."""
    env = broker_env(broker)
    host = SERVICES[broker].get("hostname", broker)
    controller = listener_ports(env["KAFKA_LISTENERS"])[env["KAFKA_CONTROLLER_LISTENER_NAMES"]]
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert f"{env['KAFKA_NODE_ID']}@{host}:{controller}" in voters


def test_broker_node_ids_are_distinct() -> None:
    """Two nodes with one id fence each other out of the cluster."""
    ids = [str(broker_env(b)["KAFKA_NODE_ID"]) for b in BROKERS]
    assert len(set(ids)) == len(ids), ids


def test_broker_host_ports_are_distinct() -> None:
    """Each broker needs its own host port for clients outside Docker."""
    ports = [port for b in BROKERS for port in published(b).values()]
    assert ports and len(set(ports)) == len(ports), ports


@pytest.mark.parametrize("broker", BROKERS)
def test_broker_advertises_its_published_port(broker: str) -> None:
    """Host clients reconnect to the advertised address, so it must be the published host port."""
    env = broker_env(broker)
    listening = listener_ports(env["KAFKA_LISTENERS"])
    advertised = listener_ports(env["KAFKA_ADVERTISED_LISTENERS"])
    mapping = published(broker)
    assert mapping, f"{broker} publishes no port"
    for container_port, host_port in mapping.items():
        names = [name for name, port in listening.items() if port == container_port]
        assert names, f"{broker} publishes {container_port}, where no listener listens"
        assert advertised.get(names[0]) == host_port, \
            f"{broker}: {names[0]} advertised on {advertised.get(names[0])}, published on {host_port}"


@pytest.mark.parametrize("broker", BROKERS)
def test_brokers_allow_the_group_timeouts_the_presets_ask_for(broker: str) -> None:
    """A classic member at time scale 0.05 asks for a 2.25 s session (Kafka's minimum is 6 s): the
    brokers take the local stack's group settings, or every scaled-down run is refused."""
    env = broker_env(broker)
    assert {name: int(env.get("KAFKA_" + name.upper().replace(".", "_"), -1))
            for name in GROUP_SETTINGS} == GROUP_SETTINGS
    assert GROUP_SETTINGS["group.min.session.timeout.ms"] <= 2250


def test_spark_default_is_the_spark_master_service() -> None:
    """The DAGs submit to `spark_default`: it must name the compose Spark master, in client mode
    (standalone refuses Python applications in cluster mode)."""
    conn = json.loads(with_defaults(AIRFLOW_ENV["AIRFLOW_CONN_SPARK_DEFAULT"]))
    host = conn["host"].removeprefix("spark://")
    master = SERVICES[host]
    assert "org.apache.spark.deploy.master.Master" in master["command"]
    assert str(conn["port"]) == master["command"][master["command"].index("--port") + 1]
    assert conn["extra"]["deploy-mode"] == "client"
    workers = [s for s in SERVICES.values() if f"spark://{host}:{conn['port']}" in s.get("command", [])]
    assert workers, "no Spark worker registers with the master spark_default names"


def test_docker_compose_accepts_the_file() -> None:
    """The authority on the format, where it is installed; unset variables exercise the defaults."""
    if shutil.which("docker") is None:
        pytest.skip("docker CLI not installed")
    version = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True,
                             timeout=60, check=False)
    if version.returncode != 0:
        pytest.skip(f"Docker Compose not available: {(version.stderr or version.stdout).strip()[:200]}")
    unset = {name for name, _ in references()}
    env = {key: value for key, value in os.environ.items() if key not in unset}
    result = subprocess.run(["docker", "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
