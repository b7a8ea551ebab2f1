"""A fleet whose stage calls an AI endpoint it was given no URL for refuses to start, saying
which endpoint and how to give it, before it opens a connection or joins its group: started
anyway, it would join, fail on the first record that needs the call, and under a supervisor
start again, join again and fail again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from consumers.config import events, pipeline_spec
from consumers.config.candidate import ENDPOINTS_ENV, Endpoints, PipelineConfig
from consumers.config.kafka_connection import KafkaAccess
from consumers.runtime.fleet import Fleet
from consumers.runtime.fleet_settings import MissingEndpoint, settings_for

REPO = Path(__file__).resolve().parents[2]
NOWHERE_DB = "postgresql://nobody@127.0.0.1:1/none"  # refused, were it tried


def test_a_fleet_without_its_stages_endpoint_is_refused_before_it_connects() -> None:
    config = PipelineConfig.from_argument("{}")
    topics = events.Topics("t", config.spec)
    settings = settings_for(config, "generate", "r1", topics, KafkaAccess.plain("127.0.0.1:1"), NOWHERE_DB,
                            Endpoints({"check": "http://127.0.0.1:1/v1/check"}))
    with pytest.raises(MissingEndpoint, match=r"'generate'.*--ai-endpoints"):
        Fleet(settings)


def test_the_fleet_command_exits_with_the_message_instead_of_joining() -> None:
    env = {k: v for k, v in os.environ.items() if k != ENDPOINTS_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "consumers.runtime.fleet", "--stage", "check", "--run-id", "r1",
         "--bootstrap-servers", "127.0.0.1:1", "--database-url", NOWHERE_DB],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"AI endpoint 'check' of pipeline {pipeline_spec.REFERENCE}" in done.stderr
