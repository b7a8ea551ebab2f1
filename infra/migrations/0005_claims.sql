-- At most one AI call per (request, stage): a member claims the pair before calling, with a
-- lease renewed before every try, so a copy of the same request waits for the result instead
-- of calling too, and the claim of a member that died is taken over once its lease expires.
CREATE TABLE stage_claims (
    request_id   text NOT NULL,
    stage        text NOT NULL,
    owner        text NOT NULL,
    lease_until  timestamptz NOT NULL,
    claimed_at   timestamptz NOT NULL DEFAULT now(),
    takeovers    integer NOT NULL DEFAULT 0,  -- claims taken over from an expired lease
    PRIMARY KEY (request_id, stage)
);

-- Attempt rows are written before the call ('started', no end) and completed after it, so a
-- call interrupted by a crash stays on record and is counted.
ALTER TABLE ai_attempts ALTER COLUMN ended_at DROP NOT NULL;
