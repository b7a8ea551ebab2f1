"""Producers feeding a share group cap their batches at its members' window, and only those:
the reference pipeline's source writes `intake` and `style`, `check` writes `generate` and
`notify`, `generate` writes `notify` (pipelines/genai_image.yaml)."""

from __future__ import annotations

import pytest

from consumers.config import profiles
from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.config.kafka_connection import KafkaConnection

KAFKA = KafkaConnection.plain("127.0.0.1:9092")


def share(window: int) -> StageConfig:
    return StageConfig(mode="share", members=4, window=window)


@pytest.mark.parametrize("writer, expected", [(None, 8), ("check", 4), ("generate", None), ("intake", None)])
def test_each_writer_takes_the_window_of_the_share_stage_it_feeds(writer: str | None,
                                                                  expected: int | None) -> None:
    config = PipelineConfig().with_stages(check=share(8), generate=share(4))
    assert config.producer_batch_records(writer) == expected


def test_a_share_stage_fed_by_nobody_else_leaves_the_other_writers_uncapped() -> None:
    config = PipelineConfig().with_stages(generate=share(4))  # check stays a flow stage
    assert [config.producer_batch_records(w) for w in (None, "check", "generate")] == [None, 4, None]


def test_flow_stages_leave_every_producer_uncapped() -> None:
    config = PipelineConfig().with_stages(check=StageConfig(mode="flow", window=8),
                                          generate=StageConfig(mode="flow", window=4))
    assert [config.producer_batch_records(w) for w in (None, "intake", "check", "generate")] == [None] * 4


def test_the_cap_is_librdkafkas_records_per_batch_on_top_of_the_profile() -> None:
    capped = profiles.producer_config("durability", KAFKA, batch_records=8)
    plain = profiles.producer_config("durability", KAFKA)
    assert capped["batch.num.messages"] == 8
    assert "batch.num.messages" not in plain
    assert {k: v for k, v in capped.items() if k != "batch.num.messages"} == plain
