-- Fleets deployed as supervisord programs (infra/supervisor.py): the program that runs each
-- (run, stage), its member count, what supervisord last reported, and the restarts seen.
-- Rows from before (program NULL) keep their meaning; the deploy plugin manages only rows
-- with a program.

ALTER TABLE deployments
    ADD COLUMN program        text,
    ADD COLUMN members        integer,
    ADD COLUMN process_state  text,                       -- RUNNING, STARTING, BACKOFF, EXITED, FATAL, ...
    ADD COLUMN restarts       integer NOT NULL DEFAULT 0, -- pid changes seen by checks (a lower bound)
    ADD COLUMN spawn_error    text,
    ADD COLUMN checked_at     timestamptz,
    ALTER COLUMN pid DROP NOT NULL;                       -- none while supervisord is between starts

-- 'scaled': replaced by a row at another member count (the program was rewritten and restarted).
ALTER TABLE deployments DROP CONSTRAINT deployments_state_check;
ALTER TABLE deployments ADD CONSTRAINT deployments_state_check
    CHECK (state IN ('running', 'stopped', 'failed', 'scaled'));

CREATE UNIQUE INDEX deployments_one_running_program ON deployments (program) WHERE state = 'running';
