-- One provider quota shared by the fleets of many pipelines (consumers/quota): the limits in
-- force, one row per quota (its lock serialises the holders' renewals), and each holder's
-- claim with the lease that keeps it.
CREATE TABLE quota_limits (
    quota                text PRIMARY KEY,
    concurrency          integer,
    requests_per_minute  double precision,
    tokens_per_minute    double precision,
    updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE quota_claims (
    quota            text NOT NULL,
    holder           text NOT NULL,
    pipeline         text NOT NULL,
    stage            text NOT NULL,
    run_id           text NOT NULL,
    lane             text NOT NULL,
    weight           double precision NOT NULL,
    demand_calls     double precision NOT NULL DEFAULT 0,
    demand_requests  double precision NOT NULL DEFAULT 0,
    demand_tokens    double precision NOT NULL DEFAULT 0,
    granted_calls    integer NOT NULL DEFAULT 0,
    granted_requests double precision NOT NULL DEFAULT 0,
    granted_tokens   double precision NOT NULL DEFAULT 0,
    in_use           integer NOT NULL DEFAULT 0,
    renewed_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,   -- no new share after this
    released_at      timestamptz NOT NULL,   -- its grant counts until its last call can have ended
    PRIMARY KEY (quota, holder)
);

-- Each renewal's grant, for the quota page's plot over time.
CREATE TABLE quota_history (
    quota            text NOT NULL,
    holder           text NOT NULL,
    pipeline         text NOT NULL,
    lane             text NOT NULL,
    at               timestamptz NOT NULL,
    demand_calls     double precision NOT NULL,
    granted_calls    integer NOT NULL,
    granted_requests double precision NOT NULL,
    granted_tokens   double precision NOT NULL,
    in_use           integer NOT NULL
);
CREATE INDEX quota_history_at ON quota_history (quota, at);
