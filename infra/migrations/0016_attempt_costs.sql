-- What each AI try used and cost: the tokens of an OpenAI-compatible answer's `usage` and the
-- cost an AI gateway reported for it (LiteLLM's `x-litellm-response-cost`), NULL where the
-- answer said nothing. measure/cost.py computes a run's cost figures from them.
ALTER TABLE ai_attempts
    ADD COLUMN tokens_input  integer,
    ADD COLUMN tokens_output integer,
    ADD COLUMN reported_cost double precision;
