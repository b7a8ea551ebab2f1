-- The in-flight limit an adaptive fleet discovered for its AI endpoint, one row per change:
-- what the benchmark plots against throughput and the limit the service had in force.
CREATE TABLE ai_limits (
    run_id       text NOT NULL,
    stage        text NOT NULL,
    at           timestamptz NOT NULL,
    limit_value  integer NOT NULL,
    in_flight    integer NOT NULL
);
CREATE INDEX ai_limits_run ON ai_limits (run_id, stage, at);
