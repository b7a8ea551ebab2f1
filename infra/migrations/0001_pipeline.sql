-- The pipeline's run records: one row per request, per stage result, per AI call attempt,
-- per rebalance event and per dead-lettered event, so every figure can be recomputed.

CREATE TABLE runs (
    run_id       text PRIMARY KEY,
    scenario     text NOT NULL DEFAULT '',
    params       jsonb NOT NULL DEFAULT '{}'::jsonb,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);

CREATE TABLE requests (
    request_id   text PRIMARY KEY,
    run_id       text NOT NULL,
    user_id      text,          -- NULL until the intake event is processed
    object_id    text,
    status       text NOT NULL,
    style        text,
    description  text,
    verdict      text,
    result_url   text,
    produced_at  timestamptz,
    received_at  timestamptz,   -- intake processed
    styled_at    timestamptz,   -- the user picked a style: the AI work was requested
    checked_at   timestamptz,
    generated_at timestamptz,
    notified_at  timestamptz
);
CREATE INDEX requests_run ON requests (run_id);

-- Exactly one row per (request, stage): re-consumption cannot duplicate a result.
CREATE TABLE stage_results (
    request_id   text NOT NULL,
    stage        text NOT NULL,
    run_id       text NOT NULL,
    outcome      text NOT NULL,
    detail       text,
    member       text NOT NULL,
    topic        text NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset bigint NOT NULL,
    completed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, stage)
);
CREATE INDEX stage_results_run ON stage_results (run_id, stage);

-- Every AI call attempt, including those whose result was discarded as a duplicate.
CREATE TABLE ai_attempts (
    id           bigserial PRIMARY KEY,
    run_id       text NOT NULL,
    request_id   text NOT NULL,
    stage        text NOT NULL,
    attempt      integer NOT NULL,
    member       text NOT NULL,
    topic        text NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset bigint NOT NULL,
    started_at   timestamptz NOT NULL,
    ended_at     timestamptz NOT NULL,
    outcome      text NOT NULL,
    http_status  integer
);
CREATE INDEX ai_attempts_run ON ai_attempts (run_id, stage);

CREATE TABLE rebalance_events (
    id           bigserial PRIMARY KEY,
    run_id       text NOT NULL,
    group_id     text NOT NULL,
    member       text NOT NULL,
    event        text NOT NULL CHECK (event IN ('assign', 'revoke', 'lost', 'max_poll_exceeded')),
    partitions   text[] NOT NULL DEFAULT '{}',
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rebalance_events_run ON rebalance_events (run_id);

CREATE TABLE dead_letters (
    id           bigserial PRIMARY KEY,
    run_id       text NOT NULL,
    request_id   text,
    stage        text NOT NULL,
    reason       text NOT NULL,
    source_topic text NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset bigint NOT NULL,
    payload      bytea,
    at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (source_topic, kafka_partition, kafka_offset)
);
CREATE INDEX dead_letters_run ON dead_letters (run_id);

-- librdkafka statistics snapshots (statistics.interval.ms), one JSON document per emission.
CREATE TABLE client_stats (
    id           bigserial PRIMARY KEY,
    run_id       text NOT NULL,
    member       text NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    stats        jsonb NOT NULL
);
CREATE INDEX client_stats_run ON client_stats (run_id, member);
