-- The partition-sizing job is gone: nothing read its table. Provisioning and the skew diagnosis
-- take the sizing formula from measure/sizing.py directly.
DROP TABLE IF EXISTS analysis_sizing;
