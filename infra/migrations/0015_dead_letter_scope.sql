-- A dead letter is one per record of a pipeline's run, not per topic offset alone: a topic
-- recreated under the same name (a new run with the same prefix) starts its offsets again, and
-- the old uniqueness left the new run's dead letter silently out, its request never settled.
-- A record consumed again within a run (after a crash) is still dead-lettered once.
ALTER TABLE dead_letters
    DROP CONSTRAINT dead_letters_source_topic_kafka_partition_kafka_offset_key,
    ADD CONSTRAINT dead_letters_record UNIQUE (pipeline, run_id, source_topic, kafka_partition, kafka_offset);
