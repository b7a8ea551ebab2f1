"""One provider quota shared by the fleets of many pipelines, held in the stack's PostgreSQL.

Each fleet that calls an endpoint on a quota is a holder: every tick it renews a lease on its
claim (what it asks for, its pipeline's lane and weight) and takes the share the allocation
gives it (`allocation.allocate`), never more than the others' grants leave free, so the sum of
the grants stays within the quota while shares move (`leases.LeaseStore`). The holder applies
its grant to the fleet's concurrency limit and per-minute budgets (`holder.QuotaHolder`). How
it is shared and why: docs/quotas.md.
"""
