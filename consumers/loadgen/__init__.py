"""The load generator: a pipeline's requests written to its entry topic, as a burst or at a steady rate."""
