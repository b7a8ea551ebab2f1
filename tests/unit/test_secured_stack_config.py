"""What `python -m infra.stack up` generates for a secured stack, checked without services: the
brokers' server.properties, the TLS material, the environment and its stack.env. Expected values
are written out by hand (ports of the `secure` stack: offset 22000)."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from psycopg2.extensions import parse_dsn
from sqlalchemy.engine import make_url

from consumers.config.kafka_connection import KafkaAccess, KafkaConnection
from consumers.config.pipeline_spec import roles
from infra import kafka_cluster, kafka_tools, layout, tls
from infra.layout import PORT_OFFSETS, Layout
from infra.stack import ports as stack_ports
from infra.stack_env import Credentials, environment, write_env
from tests.stack import java_properties

REPO = Path(__file__).resolve().parents[2]
SECURE = Layout("secure")
BOOTSTRAP = "127.0.0.1:31092,127.0.0.1:31093,127.0.0.1:31094"
CA = str(REPO / ".local" / "secure" / "tls" / "ca.pem")
PASSWORDS = {user: f"{user}-pw" for user in ("admin", *roles())}
PG_PASSWORD = "p@ss/w:rd%"  # every character URL-quoting changes
PG_QUOTED = "p%40ss%2Fw%3Ard%25"
SECURED_ONLY = {"sasl.enabled.mechanisms", "sasl.mechanism.inter.broker.protocol",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config",
                "listener.name.controller.sasl.enabled.mechanisms", "sasl.mechanism.controller.protocol",
                "listener.name.controller.plain.sasl.jaas.config", "ssl.keystore.type",
                "ssl.keystore.location", "ssl.truststore.type", "ssl.truststore.location",
                "authorizer.class.name", "super.users", "allow.everyone.if.no.acl.found"}


def secured(directory: Path, passwords: dict[str, str] = PASSWORDS) -> kafka_cluster.Secured:
    return kafka_cluster.Secured(passwords, tls.TlsFiles(directory))


def client_settings(user: str) -> dict[str, str]:
    return {"bootstrap.servers": BOOTSTRAP, "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": PASSWORDS[user],
            "ssl.ca.location": CA}


def test_a_backslash_is_written_escaped_and_read_back_as_one() -> None:
    text = kafka_cluster.properties({"ssl.keystore.location": r"C:\ks", "sasl.mechanism": "PLAIN"})
    assert text == "ssl.keystore.location=C:\\\\ks\nsasl.mechanism=PLAIN\n"
    assert java_properties(text) == {"ssl.keystore.location": r"C:\ks", "sasl.mechanism": "PLAIN"}


def test_a_plaintext_node_has_only_plaintext_listeners() -> None:
    props = java_properties(kafka_cluster.server_properties(SECURE, 2, 3))
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:31093,CONTROLLER://127.0.0.1:31193"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:31093"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert props["controller.quorum.voters"] == \
        "1@127.0.0.1:31192,2@127.0.0.1:31193,3@127.0.0.1:31194"
    assert not SECURED_ONLY & props.keys()


def test_a_secured_node_serves_sasl_ssl_with_scram_and_enforces_acls(tmp_path: Path) -> None:
    plain = java_properties(kafka_cluster.server_properties(SECURE, 2, 3))
    props = java_properties(kafka_cluster.server_properties(SECURE, 2, 3, secured(tmp_path)))
    assert props == {
        **plain,
        "listeners": "SASL_SSL://127.0.0.1:31093,CONTROLLER://127.0.0.1:31193",
        "advertised.listeners": "SASL_SSL://127.0.0.1:31093",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            'org.apache.kafka.common.security.scram.ScramLoginModule required '
            'username="admin" password="admin-pw";',
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config":
            'org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="admin" password="admin-pw" user_admin="admin-pw";',
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tmp_path / "broker.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tmp_path / "ca.pem"),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
        "allow.everyone.if.no.acl.found": "false",
    }
    # Only the inter-broker login holds a password; no role's is on the broker.
    assert not any(PASSWORDS[role] in line for role in ("source", "intake", "check", "generate")
                   for line in props.values())


def test_quotes_and_backslashes_in_a_password_survive_jaas_and_properties(tmp_path: Path) -> None:
    text = kafka_cluster.server_properties(SECURE, 1, 1, secured(tmp_path, {"admin": 'a"b\\c'}))
    line = next(x for x in text.splitlines() if x.startswith("listener.name.sasl_ssl."))
    # JAAS: a\"b\\c in quotes; the properties file then doubles every backslash.
    assert line.endswith('username="admin" password="a\\\\"b\\\\\\\\c";')


def test_the_broker_certificate_is_for_loopback_and_signed_by_the_stack_ca(tmp_path: Path) -> None:
    files = tls.ensure(tmp_path / "tls")
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    pem = files.keystore.read_bytes()
    broker, chained_ca = x509.load_pem_x509_certificates(pem)
    key = serialization.load_pem_private_key(pem, password=None)

    assert chained_ca == ca
    broker.verify_directly_issued_by(ca)  # raises unless the CA's key signed it
    assert broker.issuer == ca.subject
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not broker.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    usage = broker.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert key.public_key() == broker.public_key()
    assert b"PRIVATE KEY" not in files.ca.read_bytes()  # the CA's key is not kept


def test_tls_files_are_owner_only_and_reused(tmp_path: Path) -> None:
    files = tls.ensure(tmp_path / "tls")
    assert stat.S_IMODE((tmp_path / "tls").stat().st_mode) == 0o700
    assert stat.S_IMODE(files.keystore.stat().st_mode) == 0o600
    assert sorted(p.name for p in (tmp_path / "tls").iterdir()) == ["broker.pem", "ca.pem"]
    before = files.keystore.read_bytes(), files.ca.read_bytes()
    assert tls.ensure(tmp_path / "tls") == files
    assert (files.keystore.read_bytes(), files.ca.read_bytes()) == before


def test_the_secured_environment_hands_out_every_principal() -> None:
    env = environment(SECURE, 3, "sasl_ssl", Credentials(PG_PASSWORD, PASSWORDS), "local")
    assert env["SECURITY"] == "sasl_ssl"
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == BOOTSTRAP
    assert json.loads(env["KAFKA_CLIENT_CONFIG"]) == client_settings("admin")
    for role in ("source", "intake", "check", "generate"):
        assert json.loads(env[f"KAFKA_CLIENT_CONFIG_{role.upper()}"]) == client_settings(role)
        assert json.loads(env[f"AIRFLOW_CONN_KAFKA_DEFAULT_{role.upper()}"]) == \
            {"conn_type": "kafka", "extra": client_settings(role)}
    assert json.loads(env["AIRFLOW_CONN_KAFKA_DEFAULT"]) == {"conn_type": "kafka", "extra": {
        **client_settings("admin"), "group.id": "airflow", "auto.offset.reset": "earliest"}}

    access = KafkaAccess.from_environment(env)
    assert access is not None and access.default.settings == client_settings("admin")
    assert {role: conn.settings for role, conn in access.roles.items()} == \
        {role: client_settings(role) for role in roles()}
    assert access.of("check").principal == "User:check"


def test_every_database_url_carries_the_quoted_password() -> None:
    env = environment(SECURE, 3, "sasl_ssl", Credentials(PG_PASSWORD, PASSWORDS), "local")
    assert env["DATABASE_URL"] == f"postgresql://postgres:{PG_QUOTED}@127.0.0.1:27433/pipeline"
    assert env["AIRFLOW_CONN_POSTGRES_DEFAULT"] == f"postgres://postgres:{PG_QUOTED}@127.0.0.1:27433/pipeline"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == \
        f"postgresql+psycopg2://postgres:{PG_QUOTED}@127.0.0.1:27433/airflow"
    assert parse_dsn(env["DATABASE_URL"])["password"] == PG_PASSWORD
    assert make_url(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).password == PG_PASSWORD


def test_the_plaintext_environment_is_the_bootstrap_list_and_a_database_password() -> None:
    env = environment(Layout("dev"), 1, "plaintext", Credentials("pg-pw", {}), "cluster")
    assert env["SECURITY"] == "plaintext"
    assert json.loads(env["KAFKA_CLIENT_CONFIG"]) == {"bootstrap.servers": "127.0.0.1:9092"}
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:9092"
    assert json.loads(env["AIRFLOW_CONN_KAFKA_DEFAULT"]) == {"conn_type": "kafka", "extra": {
        "bootstrap.servers": "127.0.0.1:9092", "group.id": "airflow", "auto.offset.reset": "earliest"}}
    assert not [k for k in env if k.startswith(("KAFKA_CLIENT_CONFIG_", "AIRFLOW_CONN_KAFKA_DEFAULT_"))]
    assert env["DATABASE_URL"] == "postgresql://postgres:pg-pw@127.0.0.1:5433/pipeline"
    # SPARK=cluster: spark_default names the standalone master, in client deploy mode.
    assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"]) == {
        "conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077, "extra": {"deploy-mode": "client"}}


def test_stack_env_is_owner_only_and_gives_the_passwords_back(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "LOCAL", tmp_path)
    env = environment(SECURE, 3, "sasl_ssl", Credentials(PG_PASSWORD, PASSWORDS), "local")
    write_env(SECURE, env)
    env_file = tmp_path / "secure" / "stack.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert SECURE.saved_env() == env
    saved = Credentials.saved(SECURE)
    assert (saved.postgres, dict(saved.kafka)) == (PG_PASSWORD, PASSWORDS)
    assert SECURE.database_url("airflow") == f"postgresql://postgres:{PG_QUOTED}@127.0.0.1:27433/airflow"
    # A shell that sources it sees the same values.
    script = f'set -a; source {env_file}; printf %s "$KAFKA_CLIENT_CONFIG_CHECK"'
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert shell.stdout == env["KAFKA_CLIENT_CONFIG_CHECK"]


def test_passwords_are_generated_once_and_kept() -> None:
    first = Credentials(None, {}).completed("sasl_ssl")
    # a principal per stage name of every shipped spec, the source and the admin
    assert sorted(first.kafka) == ["admin", "check", "classify", "draft", "generate", "intake", "join",
                                   "moderate", "source", "summarize", "triage"]
    assert len({first.postgres, *first.kafka.values()}) == 12
    assert first.completed("sasl_ssl").kafka == first.kafka
    assert first.completed("sasl_ssl").postgres == first.postgres
    assert Credentials("pg", {}).completed("plaintext").kafka == {}
    assert not any(p in repr(first) for p in [first.postgres, *first.kafka.values()])


def test_kafka_tools_connect_as_the_admin_through_an_owner_only_file() -> None:
    conn = KafkaConnection(client_settings("admin"))
    with kafka_tools.connection_args(conn, ("--list",)) as extra:
        assert extra[:3] == ["--bootstrap-server", BOOTSTRAP, "--command-config"]
        path = Path(extra[3])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert java_properties(path.read_text()) == {
            "bootstrap.servers": BOOTSTRAP, "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                'username="admin" password="admin-pw";',
            "ssl.truststore.type": "PEM", "ssl.truststore.location": CA}
    assert not path.exists()
    plain = KafkaConnection.plain("127.0.0.1:9092")
    with kafka_tools.connection_args(plain, ("--list",)) as extra:
        assert extra == ["--bootstrap-server", "127.0.0.1:9092"]
    with kafka_tools.connection_args(plain, ("--producer-props", "bootstrap.servers=h:1")) as extra:
        assert extra == []


def test_every_stack_port_is_below_the_ephemeral_range() -> None:
    # Linux hands out 32768-60999 as source ports; a listening port there can be taken.
    for name in PORT_OFFSETS:
        stack = Layout(name)
        assert max(stack.controller_port(3), stack.airflow_port, stack.ai_service_port,
                   stack.ai_gateway_port, stack.postgres_port, stack.spark_master_port,
                   stack.spark_master_ui_port, stack.spark_worker_ui_port,
                   stack.spark_connect_port) < 32768, name


def test_no_two_stacks_share_a_port() -> None:
    taken: dict[int, str] = {}
    for name in PORT_OFFSETS:
        for port in stack_ports(Layout(name), 3, "cluster", "litellm").values():
            assert taken.setdefault(port, name) == name, (port, taken[port], name)


def test_security_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SECURITY", raising=False)
    assert layout.security() == "plaintext"
    monkeypatch.setenv("SECURITY", "sasl_ssl")
    assert layout.security() == "sasl_ssl"
    monkeypatch.setenv("SECURITY", "ssl")
    with pytest.raises(SystemExit):
        layout.security()
