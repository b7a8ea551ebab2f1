-- Results of the Spark analysis jobs, keyed by the run they describe: a rerun for the same run
-- id replaces its rows (partition tables) or its document (jsonb tables).

CREATE TABLE analysis_partition_load (
    run_id          text NOT NULL,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    records         bigint NOT NULL,
    bytes           bigint NOT NULL,
    distinct_keys   bigint NOT NULL,
    hot             boolean NOT NULL,
    computed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, topic, kafka_partition)
);

CREATE TABLE analysis_partition_buckets (
    run_id          text NOT NULL,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    bucket_start    timestamptz NOT NULL,
    records         bigint NOT NULL,
    computed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, topic, kafka_partition, bucket_start)
);

-- Ratios are NULL for a topic without records.
CREATE TABLE analysis_skew (
    run_id            text NOT NULL,
    topic             text NOT NULL,
    partitions        integer NOT NULL,
    records           bigint NOT NULL,
    max_over_mean     double precision,
    cv                double precision,
    gini              double precision,
    hottest_share     double precision,
    hottest_partition integer,
    hot_partitions    integer[] NOT NULL DEFAULT '{}',
    hot_threshold     double precision NOT NULL,
    computed_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, topic)
);

CREATE TABLE analysis_pipeline (
    run_id       text PRIMARY KEY,
    figures      jsonb NOT NULL,
    computed_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE analysis_sizing (
    run_id       text PRIMARY KEY,
    figures      jsonb NOT NULL,
    computed_at  timestamptz NOT NULL DEFAULT now()
);
