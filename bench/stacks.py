"""Where the benchmark's scenarios run: the main local stack, or for a scenario that needs more
brokers than it has, a three-broker local stack up for that scenario only."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from consumers.config import presets
from consumers.config.candidate import Endpoints
from consumers.config.kafka_connection import KafkaAccess
from consumers.config.pipeline_spec import PipelineSpec
from consumers.stand_in.config import ServiceConfig
from consumers.stand_in.server import serve
from infra import ai_gateway
from infra import stack as local_stack
from infra.layout import PLAINTEXT, Layout
from infra.spark_cluster import LOCAL

DURABLE_BROKERS = 3
CONNECTION_ENV = "AIRFLOW_CONN_"  # how the stack hands Airflow its connections


@dataclass(frozen=True)
class Stack:
    """Where scenarios run: a local stack's Kafka, PostgreSQL and AI stand-in, and its AI
    gateway when it has one (the Airflow connections that point at the gateway say which
    endpoints are called through it)."""

    kafka: KafkaAccess
    database_url: str
    ai_url: str
    brokers: int
    gateway_url: str | None = None
    gateway_key: str | None = None
    gateway_connections: frozenset[str] = frozenset()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Stack | None:
        kafka = KafkaAccess.from_environment(environ)
        if kafka is None or not environ.get("DATABASE_URL") or not environ.get("AI_SERVICE_URL"):
            return None
        gateway = environ.get("AIRFLOW_CONN_AI_GATEWAY")
        through = frozenset(name[len(CONNECTION_ENV):].lower() for name, value in environ.items()
                            if gateway and name.startswith(CONNECTION_ENV) and value == gateway)
        return cls(kafka, environ["DATABASE_URL"], environ["AI_SERVICE_URL"],
                   int(environ.get("KAFKA_BROKERS", "1")), environ.get("AI_GATEWAY_URL"),
                   environ.get("AI_GATEWAY_KEY"), through)

    def endpoints(self, spec: PipelineSpec) -> Endpoints:
        """Each endpoint of `spec` on the stand-in, or through the gateway with its key."""
        endpoints = Endpoints.on(self.ai_url, spec)
        for name in self.through_gateway(spec):
            endpoints.urls[name] = f"{self.gateway_url}{spec.endpoints[name].path}"
            endpoints.keys[name] = self.gateway_key or ""
        return endpoints

    def through_gateway(self, spec: PipelineSpec) -> list[str]:
        return [name for name, e in spec.endpoints.items()
                if self.gateway_url and e.connection in self.gateway_connections]

    def gateway_budgets(self, p: presets.PresetParams) -> dict[str, dict[str, int]]:
        """The per-minute limits the gateway sets on the models it serves to `p`'s endpoints, in
        the run's minutes: the gateway meters the clock's (60 s), the run's durations are scaled
        by its time scale, so N a clock minute is N x time scale a run's minute."""
        models = {m.name: m for m in ai_gateway.MODELS}
        budgets = {}
        for name in self.through_gateway(p.spec):
            model = models.get(p.spec.endpoints[name].model or "")
            if model is not None:
                budgets[name] = {"requests_per_minute": max(1, round(model.rpm * p.time_scale)),
                                 "tokens_per_minute": max(1, round(model.tpm * p.time_scale))}
        return budgets


@contextmanager
def scenario_stack(brokers: int, main: Stack, durable_stack: str) -> Iterator[Stack]:
    """The stack a scenario that needs `brokers` runs on: the main one, or on a main stack of
    fewer, durable_stack's."""
    if main.brokers < brokers:
        with durable(Layout(durable_stack)) as stack:
            yield stack
    else:
        yield main


@contextmanager
def durable(layout: Layout) -> Iterator[Stack]:
    """A three-broker local stack for `durable` alone: started here and stopped after it, unless
    it was running already, since its brokers slow every other measurement even idle
    (docs/benchmarks.md#the-scenarios)."""
    with local_stack.started(layout, DURABLE_BROKERS, PLAINTEXT, LOCAL, ai_gateway.NONE):
        stack = Stack.from_environment(layout.saved_env())
        if stack is None:
            raise SystemExit(f"the {layout.name} stack started but wrote no addresses to {layout.env_file}")
        yield stack


@contextmanager
def own_stand_in(spec: PipelineSpec, time_scale: float, limit: int) -> Iterator[str]:
    """A stand-in of the spec's endpoints in this process, for a benchmark that sets its time
    scale and limits apart from the stack's; its base URL."""
    server = serve(ServiceConfig.from_specs([spec], time_scale=time_scale, limit=limit),
                   host="127.0.0.1", port=0)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
