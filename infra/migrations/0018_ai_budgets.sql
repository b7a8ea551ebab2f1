-- The per-minute budgets an adaptive fleet learned from its AI endpoint's answers, one row per
-- change and per turn of a fixed window learned: what the benchmark plots against throughput.
CREATE TABLE ai_budgets (
    run_id      text NOT NULL,
    stage       text NOT NULL,
    at          timestamptz NOT NULL,
    kind        text NOT NULL,
    per_minute  double precision NOT NULL,
    turned      boolean NOT NULL
);
CREATE INDEX ai_budgets_run ON ai_budgets (run_id, stage, at);
