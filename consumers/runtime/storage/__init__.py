"""PostgreSQL persistence of every pipeline's run records (schema in infra/migrations).

One layout for every pipeline spec, keyed by (pipeline, key, stage), where the key is the value
of the spec's key field (the `request_id` column). A request row keeps what the stages record
about it (`fields`, merged, so events arriving on separate topics are joined by key), its
status and how many entry stages took it. Results are idempotent by (pipeline, key, stage):
`stage_results` has that primary key and every write is `ON CONFLICT DO NOTHING`, so
re-consumption never duplicates a result. `stage_claims` makes sure at most one member calls the
AI for a (pipeline, key, stage) at a time, and `ai_attempts` keeps one row per try, written
before it is sent, so every call is counted.

Statuses only move forward: each carries a rank (the stage's position in the spec), a lower
rank never overwrites a higher one, and a settled status (completed, rejected) is final; a
dead letter settles the request unless it had already settled.

The package: the records every write names (`records`), the statements (`statements`), the pool
and its writes (`store`).
"""

from consumers.runtime.storage.records import (
    CallClaim,
    Claim,
    ClaimLost,
    Ended,
    Key,
    Line,
    Origin,
    Parked,
    Status,
)
from consumers.runtime.storage.store import (
           LEFT_FOR_OTHERS,
           Storage,
           fitted_pool_size,
           free_connections,
           sized_pool,
)

__all__ = ["LEFT_FOR_OTHERS", "CallClaim", "Claim", "ClaimLost", "Ended", "Key", "Line", "Origin", "Parked",
           "Status", "Storage", "fitted_pool_size", "free_connections", "sized_pool"]
