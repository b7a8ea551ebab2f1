# The image of a consumer fleet pod (plugins/pipeline_ops/fleets/kubernetes.py), from the repository root:
#
#   docker build -f infra/docker/fleet.Dockerfile -t <registry>/genai-kafka-platform/fleet:<tag> .
#
# It holds the runtime's packages (consumers/ runtime, kafka_clients, ai and config: pyproject.toml's
# import contract "runtime"; not the run drivers, the AI stand-in or the load generator), the
# figure definitions they import (measure/sizing.py, through consumers.kafka_clients.provisioning),
# the pipeline specs it runs (pipelines/: each spec and its load generator) and the packages they
# import, at requirements.lock's versions (the lock as pip constraints), so a pod runs the library
# versions the platform is tested with, without the Airflow, Spark and browser packages the rest
# of the lock brings. The pod's command and its environment (a Secret) come from the Deployment;
# SIGTERM makes the fleet drain and commit.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.lock infra/docker/fleet-requirements.txt /tmp/
RUN pip install -c /tmp/requirements.lock -r /tmp/fleet-requirements.txt \
    && rm /tmp/requirements.lock /tmp/fleet-requirements.txt

WORKDIR /app
COPY consumers/__init__.py consumers/
COPY consumers/runtime/ consumers/runtime/
COPY consumers/kafka_clients/ consumers/kafka_clients/
COPY consumers/ai/ consumers/ai/
COPY consumers/quota/ consumers/quota/
COPY consumers/canary/ consumers/canary/
COPY consumers/config/ consumers/config/
COPY measure/__init__.py measure/sizing.py measure/quota_share.py measure/cost.py measure/
COPY pipelines/ pipelines/
# A numeric user, so that the pod's runAsNonRoot can check it.
USER 10001:10001
