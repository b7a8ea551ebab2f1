-- Canaries on live topics (plugins/pipeline_ops/canary, consumers/canary): each canary and its
-- steps, the partitions the active version's group lends to the candidate's fleet (their
-- hand-over offsets and the lease the candidate keeps them by), and which version each fleet
-- member runs, so every row a member writes says which version handled it.
CREATE TABLE canaries (
    id                 bigserial PRIMARY KEY,
    pipeline           text NOT NULL,
    run_id             text NOT NULL,          -- the live run both versions write under
    active_version     integer NOT NULL REFERENCES configurations (version),
    candidate_version  integer NOT NULL REFERENCES configurations (version),
    stages             text[] NOT NULL,        -- the stages the candidate changes
    plan               jsonb NOT NULL,
    state              text NOT NULL DEFAULT 'running'
                       CHECK (state IN ('running', 'promoted', 'rolled_back', 'refused')),
    step               integer NOT NULL DEFAULT 0,
    reason             text NOT NULL DEFAULT '',
    started_at         timestamptz NOT NULL DEFAULT now(),
    ended_at           timestamptz
);
CREATE INDEX canaries_pipeline ON canaries (pipeline, started_at DESC);

CREATE TABLE canary_steps (
    canary_id   bigint NOT NULL REFERENCES canaries (id),
    step        integer NOT NULL,
    share       double precision NOT NULL,     -- asked: the candidate's share of the partitions
    partitions  integer NOT NULL,              -- lent to it
    started_at  timestamptz NOT NULL,          -- the analysis window
    ended_at    timestamptz,
    verdict     text CHECK (verdict IN ('pass', 'marginal', 'fail')),
    decision    text,                          -- next, promote, rollback, and why
    figures     jsonb NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (canary_id, step)
);

-- lending: asked of the partition's owner in the active group; lent: handed over at `position`
-- (the active group's commit), held by the candidate member `holder` while its lease lasts;
-- returning: asked back; returned: handed back at `position`. The active owner deletes the row
-- when it takes the partition back, from `position`, or from the candidate group's commit when
-- the lease lapsed (the candidate died).
CREATE TABLE partition_loans (
    group_id     text NOT NULL,                -- the active version's group
    topic        text NOT NULL,
    partition    integer NOT NULL,
    canary_id    bigint NOT NULL REFERENCES canaries (id),
    state        text NOT NULL CHECK (state IN ('lending', 'lent', 'returning', 'returned')),
    position     bigint,
    holder       text,
    lease_until  timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);

CREATE TABLE fleet_members (
    run_id      text NOT NULL,
    member      text NOT NULL,
    stage       text NOT NULL,
    version     integer,                       -- NULL: started outside the registry
    canary      bigint REFERENCES canaries (id),  -- a canary's fleet; NULL: the group's own
    started_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, member)
);

-- A member's loans to a canary, and a candidate member's borrowings, beside its group events.
ALTER TABLE rebalance_events DROP CONSTRAINT rebalance_events_event_check;
ALTER TABLE rebalance_events ADD CONSTRAINT rebalance_events_event_check
    CHECK (event IN ('assign', 'revoke', 'lost', 'max_poll_exceeded',
                     'lend', 'take_back', 'borrow', 'give_back'));

-- A version made active by a canary that passed every step.
ALTER TABLE promotions DROP CONSTRAINT promotions_action_check;
ALTER TABLE promotions ADD CONSTRAINT promotions_action_check
    CHECK (action IN ('promote', 'rollback', 'initial', 'canary'));
