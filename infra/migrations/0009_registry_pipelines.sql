-- A configuration belongs to one pipeline (its spec's name, also in `config`), and each pipeline
-- has its own active configuration: a gate decision compares a candidate only with the active
-- version of the same pipeline, and a rollback returns within one pipeline. Configurations
-- registered before pipelines were declared as data are the reference pipeline's.

ALTER TABLE configurations ADD COLUMN pipeline text NOT NULL DEFAULT 'genai_image';
UPDATE configurations SET pipeline = config->>'pipeline' WHERE config ? 'pipeline';
ALTER TABLE configurations ALTER COLUMN pipeline DROP DEFAULT;

-- At most one active configuration per pipeline; the registry code keeps it at exactly one.
DROP INDEX configurations_one_active;
CREATE UNIQUE INDEX configurations_one_active ON configurations (pipeline) WHERE active;
