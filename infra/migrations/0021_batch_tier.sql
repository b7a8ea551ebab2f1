-- The batch tier (consumers/runtime/batch_keeper.py): the records a stage parked for a provider's
-- batch, the batches they went out in, and which tier each attempt row was a try of.
--
-- A parked record is owned by its line from then on: its offset is committed, and the line's
-- keeper sends its event to the stage again once the line is answered or has fallen back to a
-- realtime call. A line moves pending -> submitted -> answered, or to fallen_back from pending or
-- submitted (its fallback time came, its batch failed, its line erred); exactly one of answered
-- and fallen_back wins, so a record is resumed once either way.
ALTER TABLE ai_attempts ADD COLUMN tier text NOT NULL DEFAULT 'realtime';

-- assembling: lines taken, the file not yet a provider's batch (`input_file_id` once uploaded);
-- submitted: the provider's batch `provider_id` is being polled; ended: its outcome is in.
-- `owner` works on the batch while its lease lasts; a keeper that died leaves it to another.
CREATE TABLE ai_batches (
    id             bigserial PRIMARY KEY,
    pipeline       text NOT NULL,
    run_id         text NOT NULL,
    stage          text NOT NULL,
    state          text NOT NULL DEFAULT 'assembling'
                   CHECK (state IN ('assembling', 'submitted', 'ended')),
    lines          integer NOT NULL,
    input_file_id  text,
    provider_id    text,
    outcome        text,                  -- the provider's last status: completed, failed, expired, cancelled
    owner          text NOT NULL,
    lease_until    timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    submitted_at   timestamptz,
    ended_at       timestamptz
);
CREATE INDEX ai_batches_open ON ai_batches (pipeline, run_id, stage) WHERE state <> 'ended';

CREATE TABLE batch_lines (
    pipeline         text NOT NULL,
    request_id       text NOT NULL,
    stage            text NOT NULL,
    run_id           text NOT NULL,
    event            jsonb NOT NULL,       -- sent to the stage again once the line is settled
    body             jsonb NOT NULL,       -- the request the line carries
    member           text NOT NULL,        -- where the parked record came from
    topic            text NOT NULL,
    kafka_partition  integer NOT NULL,
    kafka_offset     bigint NOT NULL,
    redrive          integer NOT NULL DEFAULT 0,
    deadline_at      timestamptz NOT NULL,
    fallback_at      timestamptz NOT NULL, -- called realtime from then on if not answered
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'submitted', 'answered', 'fallen_back')),
    batch_id         bigint REFERENCES ai_batches (id),
    answer           jsonb,                -- the answer's body, once answered
    why              text,                 -- why it fell back
    parked_at        timestamptz NOT NULL DEFAULT now(),
    settled_at       timestamptz,          -- answered or fallen back
    resent_at        timestamptz,          -- its event sent to the stage again
    PRIMARY KEY (pipeline, request_id, stage)
);
CREATE INDEX batch_lines_open ON batch_lines (pipeline, run_id, stage, state) WHERE resent_at IS NULL;
CREATE INDEX batch_lines_batch ON batch_lines (batch_id);
