"""The brokers run with the settings the stack writes for them."""

from __future__ import annotations

from confluent_kafka.admin import ConfigResource

from infra.kafka_cluster import node_dir
from tests.stack import Stack, java_properties

SECRETS = ("password", "jaas.config")  # described as sensitive, without a value


def test_every_setting_in_server_properties_is_one_the_broker_applies(stack: Stack) -> None:
    """A misspelt or topic-level name is no error to a broker: it keeps its default and describes
    the name as a sensitive setting it does not know. `file.delete.delay.ms` went unnoticed so."""
    admin = stack.connection.admin()
    for node in range(1, stack.brokers + 1):
        settings = java_properties((node_dir(stack.layout, node) / "server.properties").read_text())
        resource = ConfigResource(ConfigResource.Type.BROKER, str(node))
        described = admin.describe_configs([resource])[resource].result(30)
        checked = {name: value for name, value in settings.items()
                   if not any(secret in name for secret in SECRETS)}
        assert len(checked) > 20, settings  # the file was read, not an empty or foreign one
        applied = {name: None if name not in described or described[name].is_sensitive
                   else described[name].value for name in checked}
        assert applied == checked
