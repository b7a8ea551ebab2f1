"""A pipeline declared and configured: its spec, its events and topics, its candidate
configurations and their presets; how the platform reaches Kafka (the connection) and tunes
it (the profiles)."""
