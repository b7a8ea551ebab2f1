-- What the gate and the registry keep beyond decisions and promotions: why a version was
-- activated (a rollback's reason), the alarms raised when a re-measurement of the active
-- version fails, and the capacity searches of a version, beside its configuration.

ALTER TABLE promotions ADD COLUMN reason text NOT NULL DEFAULT '';

CREATE TABLE regression_alarms (
    id           bigserial PRIMARY KEY,
    version      integer NOT NULL REFERENCES configurations (version),
    decision_id  bigint NOT NULL REFERENCES gate_decisions (id),
    run_id       text NOT NULL,
    failed       jsonb NOT NULL,   -- the checks that failed, as the gate reported them
    raised_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX regression_alarms_version ON regression_alarms (version, raised_at DESC);

CREATE TABLE capacity_searches (
    id                   bigserial PRIMARY KEY,
    version              integer NOT NULL REFERENCES configurations (version),
    run_id               text NOT NULL,
    max_sustainable_rps  double precision,  -- NULL: not even the lowest step was sustained
    ai_capacity_rps      double precision,  -- measured at the highest sustained step
    objective            jsonb NOT NULL,    -- latency objective, lag bound, step length
    steps                jsonb NOT NULL,    -- every step: rate, lag, p99, sustained or not
    searched_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX capacity_searches_version ON capacity_searches (version, searched_at DESC);
