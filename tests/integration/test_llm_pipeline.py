"""The LLM pipeline against the real broker, PostgreSQL and the stand-in's OpenAI-compatible chat
endpoint: a small model triages each ticket, a large model drafts the replies, both on one path
told apart by model, and every call's tokens are the ones the stand-in counted."""

from __future__ import annotations

import pytest

from consumers.config.candidate import PipelineConfig, StageConfig
from consumers.runs.pipeline_run import running_pipeline
from tests.integration.pipeline_fixtures import AIService, ai_service, query
from tests.stack import Stack

TICKETS = 120
TIME_SCALE = 0.1


@pytest.fixture(scope="module")
def llm_run(stack: Stack) -> tuple[str, dict[str, int], dict]:
    with ai_service(time_scale=TIME_SCALE) as ai:
        return run(stack, ai)


def run(stack: Stack, ai: AIService) -> tuple[str, dict[str, int], dict]:
    config = PipelineConfig(pipeline="support_tickets", partitions=4, time_scale=TIME_SCALE,
                            replication_factor=1).with_stages(draft=StageConfig(window=32))
    with running_pipeline(config, stack.kafka, stack.database_url,
                          ai.endpoints_of("support_tickets")) as pipeline:
        pipeline.send(TICKETS, reject_share=0.25)
        counts = pipeline.wait_terminal(TICKETS, timeout_s=180)
    return pipeline.run_id, counts, ai.stats()


def test_spam_is_closed_and_every_other_ticket_gets_the_large_model_s_reply(
        stack: Stack, llm_run: tuple[str, dict[str, int], dict]) -> None:
    run_id, counts, stats = llm_run
    assert counts.get("completed", 0) + counts.get("rejected", 0) == TICKETS, counts
    assert 0 < counts.get("rejected", 0) < TICKETS / 2, counts  # about a quarter are spam
    categories = dict(query(stack.database_url, "SELECT result->>'category', count(*) FROM stage_results "
                            "WHERE run_id = %s AND stage = 'triage' GROUP BY 1", run_id))
    assert set(categories) <= {"billing", "bug", "how_to", "spam"}
    assert categories["spam"] == counts["rejected"]
    replies = query(stack.database_url, "SELECT result->>'reply', (result->>'reply_tokens')::int "
                    "FROM stage_results WHERE run_id = %s AND stage = 'draft'", run_id)
    assert len(replies) == counts["completed"]
    # The stand-in's draft is 310 characters: 78 tokens at four characters a token, under max_tokens.
    assert {(text.startswith("Hello, and thank you"), tokens) for text, tokens in replies} == {(True, 78)}
    assert (stats["small_model"]["served"], stats["large_model"]["served"]) == (TICKETS, counts["completed"])
    assert stats["small_model"]["duplicate_served"] == stats["large_model"]["duplicate_served"] == 0
