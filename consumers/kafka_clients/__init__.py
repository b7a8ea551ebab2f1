"""Kafka clients and administration: the producer, the records the client hands back, topic
provisioning and ACLs."""
