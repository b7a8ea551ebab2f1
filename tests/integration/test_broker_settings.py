"""The brokers run with the settings the stack writes for them."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka.admin import ConfigResource

from infra.kafka_cluster import node_dir
from tests.stack import Stack

SECRETS = ("password", "jaas.config")  # described as sensitive, without a value


def written(path: Path) -> dict[str, str]:
    """The settings of a server.properties file, as the stack wrote them."""
    lines = (line for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return dict(line.split("=", 1) for line in lines)


def test_every_setting_in_server_properties_is_one_the_broker_applies(stack: Stack) -> None:
    """A misspelt or topic-level name is no error to a broker: it keeps its default and describes
    the name as a sensitive setting it does not know. `file.delete.delay.ms` went unnoticed so."""
    admin = stack.connection.admin()
    for node in range(1, stack.brokers + 1):
        settings = written(node_dir(stack.layout, node) / "server.properties")
        resource = ConfigResource(ConfigResource.Type.BROKER, str(node))
        described = admin.describe_configs([resource])[resource].result(30)
        checked = {name: value for name, value in settings.items()
                   if not any(secret in name for secret in SECRETS)}
        assert len(checked) > 20, settings  # the file was read, not an empty or foreign one
        applied = {name: None if name not in described or described[name].is_sensitive
                   else described[name].value for name in checked}
        assert applied == checked
