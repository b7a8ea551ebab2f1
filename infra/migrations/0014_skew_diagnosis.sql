-- Why a topic's partitions are uneven (spark/partition_load.py, measure/skew.py).
-- Per partition: its keyless records, the size of its key sample and the sample's most frequent
-- keys ([{key, sampled, share, share_error, topic_share}]); distinct keys are counted only on
-- request (--distinct-keys), NULL otherwise.
ALTER TABLE analysis_partition_load
    ALTER COLUMN distinct_keys DROP NOT NULL,
    ADD COLUMN keyless  bigint NOT NULL DEFAULT 0,
    ADD COLUMN sampled  bigint NOT NULL DEFAULT 0,
    ADD COLUMN top_keys jsonb NOT NULL DEFAULT '[]'::jsonb;

-- Per topic: the diagnosis (measure.skew.CAUSES), its one-line recommendation and the figures
-- that decided it. NULL for rows written before the diagnosis existed.
ALTER TABLE analysis_skew
    ADD COLUMN diagnosis         text,
    ADD COLUMN recommendation    text,
    ADD COLUMN diagnosis_figures jsonb;
