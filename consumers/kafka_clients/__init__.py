"""Kafka clients and administration: how the platform connects, produces, tunes and provisions
topics, and grants ACLs."""
