-- Failures as users meet them: an AI endpoint's health apart from any record's fault, one try
-- budget per (request, stage, redrive), and what a dead letter needs to be sent back.

-- An endpoint's circuit, one row per transition (closed -> open -> half_open -> closed | open),
-- written by the fleet whose members share it: what the gate page and the triage read.
CREATE TABLE endpoint_circuits (
    id        bigserial PRIMARY KEY,
    run_id    text NOT NULL,
    stage     text NOT NULL,
    endpoint  text NOT NULL,
    state     text NOT NULL CHECK (state IN ('closed', 'open', 'half_open')),
    detail    text NOT NULL DEFAULT '',
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX endpoint_circuits_run ON endpoint_circuits (run_id, stage, at);

-- The redrive round a try belongs to (the `redrive_count` header of the record it served), and
-- whether its failure was the request's own (not while the endpoint's circuit had judged it
-- down): a request's own failures are counted against its stage's max_attempts per round.
ALTER TABLE ai_attempts
    ADD COLUMN redrive     integer NOT NULL DEFAULT 0,
    ADD COLUMN own_failure boolean NOT NULL DEFAULT false;
CREATE INDEX ai_attempts_request ON ai_attempts (pipeline, request_id, stage);

-- A dead letter keeps the record's key and its redrive round, so it can go back to its source
-- topic as it came, and a record is not redriven past a limit.
ALTER TABLE dead_letters
    ADD COLUMN kafka_key bytea,
    ADD COLUMN redrive   integer NOT NULL DEFAULT 0;
