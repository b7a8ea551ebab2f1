-- Dead-letter triage (plugins/pipeline_ops/triage.py): one row per triage, with the dead letters
-- it counted (after_id < dead_letters.id <= through_id), what it counted by pipeline, stage and
-- reason, the pipelines past the alarm threshold and the ai_unavailable letters it sent back.
-- The highest through_id is the watermark the next triage counts from.
CREATE TABLE triage_runs (
    id          bigserial PRIMARY KEY,
    dag_run_id  text NOT NULL UNIQUE,   -- a retried triage task finds its own row again
    after_id    bigint NOT NULL,
    through_id  bigint NOT NULL,
    letters     integer NOT NULL,
    counts      jsonb NOT NULL DEFAULT '[]'::jsonb,   -- [{pipeline, stage, reason, letters}]
    threshold   integer NOT NULL,
    alarms      jsonb NOT NULL DEFAULT '{}'::jsonb,   -- {pipeline: letters} past the threshold
    redrives    jsonb NOT NULL DEFAULT '[]'::jsonb,   -- [{pipeline, run, stage, letters, since}]
    at          timestamptz NOT NULL DEFAULT now()
);

-- Triage starts from where the table stands when it is installed: dead letters of the past are
-- neither counted nor sent back by it.
INSERT INTO triage_runs (dag_run_id, after_id, through_id, letters, threshold)
SELECT 'installed', 0, coalesce(max(id), 0), 0, 0 FROM dead_letters;
