-- Dead letters sent back to their source topic (consumers/runs/redrive.py): one row per dead letter a
-- redrive considered, with who asked, when, what became of it and the redrive round it was sent
-- (or would have been) as its `redrive_count` header.
CREATE TABLE redrives (
    id              bigserial PRIMARY KEY,
    dead_letter_id  bigint NOT NULL REFERENCES dead_letters (id) ON DELETE CASCADE,
    batch           text NOT NULL,    -- the command or DAG run that considered it
    requested_by    text NOT NULL,
    outcome         text NOT NULL
        CHECK (outcome IN ('redriven', 'skipped_done', 'skipped_limit', 'skipped_reference')),
    round           integer NOT NULL,
    at              timestamptz NOT NULL DEFAULT now(),
    -- where the broker put the record; NULL while a redriven record's delivery is unconfirmed
    sent_partition  integer,
    sent_offset     bigint,
    sent_at         timestamptz
);
CREATE INDEX redrives_dead_letter ON redrives (dead_letter_id);
CREATE INDEX redrives_batch ON redrives (batch);
-- A dead letter goes back at most once.
CREATE UNIQUE INDEX redrives_once ON redrives (dead_letter_id) WHERE outcome = 'redriven';

-- Dead letters are selected by pipeline, run and time.
CREATE INDEX dead_letters_pipeline ON dead_letters (pipeline, at);
