-- Fleet processes started by the deploy operator: what runs, where its metrics are, how it ended.

CREATE TABLE deployments (
    id            bigserial PRIMARY KEY,
    run_id        text NOT NULL,
    version       integer REFERENCES configurations (version),
    stage         text NOT NULL,
    pid           integer NOT NULL,
    metrics_port  integer NOT NULL,
    state         text NOT NULL CHECK (state IN ('running', 'stopped', 'failed')),
    health        text NOT NULL DEFAULT 'starting',
    log_file      text NOT NULL,
    exit_code     integer,
    started_at    timestamptz NOT NULL DEFAULT now(),
    stopped_at    timestamptz
);
CREATE INDEX deployments_run ON deployments (run_id, state);
