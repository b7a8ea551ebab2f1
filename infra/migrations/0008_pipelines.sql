-- Pipelines declared as data (pipelines/*.yaml). Every row is keyed by its pipeline and the
-- value of the pipeline's key field (the `request_id` column, whatever the field is called):
-- one request row per (pipeline, key), one result per (pipeline, key, stage). What a pipeline
-- keeps about a request (the fields its stages record and their AI answers) is in `fields`.

ALTER TABLE requests
    ADD COLUMN pipeline    text NOT NULL DEFAULT 'genai_image',
    ADD COLUMN fields      jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN status_rank integer NOT NULL DEFAULT 0,   -- statuses only move forward
    ADD COLUMN entries     integer NOT NULL DEFAULT 0,   -- entry stages that took the request
    ADD COLUMN finished_at timestamptz;                  -- reached completed or rejected
UPDATE requests SET
    fields = jsonb_strip_nulls(jsonb_build_object('user_id', user_id, 'object_id', object_id,
             'style', style, 'description', description, 'verdict', verdict, 'result_url', result_url)),
    entries = (received_at IS NOT NULL)::int + (styled_at IS NOT NULL)::int,
    finished_at = CASE status WHEN 'completed' THEN generated_at WHEN 'rejected' THEN checked_at END;
ALTER TABLE requests
    DROP COLUMN user_id, DROP COLUMN object_id, DROP COLUMN style, DROP COLUMN description,
    DROP COLUMN verdict, DROP COLUMN result_url, DROP COLUMN received_at, DROP COLUMN styled_at,
    DROP COLUMN checked_at, DROP COLUMN generated_at,
    DROP CONSTRAINT requests_pkey, ADD PRIMARY KEY (pipeline, request_id),
    ALTER COLUMN pipeline DROP DEFAULT;

-- A stage's result: the fields its work kept (NULL for a stage without AI work).
ALTER TABLE stage_results
    ADD COLUMN pipeline text NOT NULL DEFAULT 'genai_image',
    ADD COLUMN result   jsonb;
UPDATE stage_results SET result = CASE stage WHEN 'check' THEN jsonb_build_object('verdict', detail)
                                             WHEN 'generate' THEN jsonb_build_object('result_url', detail) END;
ALTER TABLE stage_results
    DROP COLUMN detail,
    DROP CONSTRAINT stage_results_pkey, ADD PRIMARY KEY (pipeline, request_id, stage),
    ALTER COLUMN pipeline DROP DEFAULT;

ALTER TABLE stage_claims ADD COLUMN pipeline text NOT NULL DEFAULT 'genai_image';
ALTER TABLE stage_claims
    DROP CONSTRAINT stage_claims_pkey, ADD PRIMARY KEY (pipeline, request_id, stage),
    ALTER COLUMN pipeline DROP DEFAULT;

ALTER TABLE ai_attempts ADD COLUMN pipeline text NOT NULL DEFAULT 'genai_image';
ALTER TABLE ai_attempts ALTER COLUMN pipeline DROP DEFAULT;
ALTER TABLE dead_letters ADD COLUMN pipeline text NOT NULL DEFAULT 'genai_image';
ALTER TABLE dead_letters ALTER COLUMN pipeline DROP DEFAULT;
