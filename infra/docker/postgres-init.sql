-- Runs once, on the first start of an empty data volume (postgres image's initdb hook):
-- the same two databases the local stack creates. `pipeline` holds the run records (its schema
-- comes from infra/migrations via the `migrate` service), `airflow` the Airflow metadata.
CREATE DATABASE pipeline;
CREATE DATABASE airflow;
