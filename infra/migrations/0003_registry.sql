-- The configuration registry: versioned pipeline configurations, exactly one active, the gate's
-- decisions with every figure they used, and the history of promotions and rollbacks.

CREATE TABLE configurations (
    version      serial PRIMARY KEY,
    name         text NOT NULL,
    config       jsonb NOT NULL,
    note         text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    active       boolean NOT NULL DEFAULT false
);
-- At most one active configuration; the registry code keeps it at exactly one.
CREATE UNIQUE INDEX configurations_one_active ON configurations (active) WHERE active;

CREATE TABLE gate_decisions (
    id             bigserial PRIMARY KEY,
    run_id         text NOT NULL,
    candidate      integer NOT NULL REFERENCES configurations (version),
    active_before  integer REFERENCES configurations (version),
    passed         boolean NOT NULL,
    reasons        jsonb NOT NULL,   -- one entry per check: name, passed, measured, required
    figures        jsonb NOT NULL,   -- every figure the decision used
    thresholds     jsonb NOT NULL,
    decided_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX gate_decisions_candidate ON gate_decisions (candidate, decided_at DESC);

CREATE TABLE promotions (
    id             bigserial PRIMARY KEY,
    version        integer NOT NULL REFERENCES configurations (version),
    previous       integer REFERENCES configurations (version),
    action         text NOT NULL CHECK (action IN ('promote', 'rollback', 'initial')),
    run_id         text,
    figures        jsonb NOT NULL DEFAULT '{}'::jsonb,
    at             timestamptz NOT NULL DEFAULT now()
);
