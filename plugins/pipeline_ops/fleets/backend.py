"""What every deployment backend takes and does: a run's fleets, one per stage of the
configuration's pipeline, started from a configuration and the addresses in a `FleetEnvironment`,
stages resized (by default those that call an AI endpoint), their health checked, all stopped."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from consumers.config.candidate import Endpoints, PipelineConfig
from consumers.config.kafka_connection import KafkaAccess

TOKEN_ENV = "AI_SERVICE_TOKEN"  # the fleet's default --ai-token-env
# A fleet's health, whatever runs it: healthy | starting | restarting | stopping | dead.
DOWN = ("dead", "restarting")


@dataclass(frozen=True)
class FleetEnvironment:
    """Addresses the fleet processes need, taken from the Airflow connections."""

    kafka: KafkaAccess
    database_url: str
    ai_urls: Mapping[str, str]  # the URL of each AI endpoint of the pipeline spec, by endpoint name
    ai_keys: Mapping[str, str] = field(default_factory=dict)  # an endpoint's key, from its connection

    def variables(self, stage: str) -> dict[str, str]:
        """A stage fleet's environment: its own Kafka principal, the addresses (the AI endpoints
        as the fleet's `AI_ENDPOINTS` JSON), the endpoints' own keys, and the stand-in's token
        when this process has one. Secrets travel here (an owner-only program file, a Kubernetes
        Secret), never on the command line."""
        env = {**self.kafka.of(stage).environment(), "DATABASE_URL": self.database_url,
               **Endpoints(dict(self.ai_urls), keys=dict(self.ai_keys)).environment()}
        if os.environ.get(TOKEN_ENV):
            env[TOKEN_ENV] = os.environ[TOKEN_ENV]
        return env


class FleetBackend(Protocol):
    """Runs the fleets of a run, one per stage of its pipeline, and records them in the
    `deployments` table."""

    def start(self, run_id: str, version: int, config: PipelineConfig, env: FleetEnvironment,
              ready_timeout_s: float = 90.0) -> list[dict]:
        """Start every stage's fleet; return once all their members have partitions."""
        ...

    def scale(self, run_id: str, version: int, config: PipelineConfig, env: FleetEnvironment,
              stages: tuple[str, ...] | None = None, ready_timeout_s: float = 90.0) -> list[dict]:
        """Run `stages` (default: the pipeline's AI stages) at `config`'s member counts."""
        ...

    def check(self, run_id: str) -> dict[str, str]:
        """Each stage's health, also recorded."""
        ...

    def stop(self, run_id: str) -> dict[str, int | None]:
        """Stop every fleet gracefully; each stage's exit code (None: none known)."""
        ...
