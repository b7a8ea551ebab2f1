"""How many calls one AI endpoint takes at once, discovered while calling it.

Model APIs publish no stable concurrency limit: it moves with their load and the account's tier,
and shows as 429s at admission (or as latency, for a service that queues instead). Their latencies
are heavy-tailed, so one slow answer says nothing: the limit is learned from refusals, and from
latency only through window medians against a baseline. One limiter serves every member of a
fleet through its shared AI client. Budget refusals (a minute's requests or tokens spent) never
reach it: they say "later", not "fewer" (`consumers.ai.rate_budget`). A permit is held from
`acquire` (the limit counts it), but a call is counted at the endpoint only from `sent`: what the
caller does in between (its try put on record) is no call the endpoint holds.

Three parts: the permits callers take (`permits.AdaptiveLimit`), the algorithm they pass each
sample to (`algorithm.LearnedLimit`, tuned by `settings.LimitSettings`, timing what it learns by
`measurement`), and the change log it tells of each move (`log.ChangeLog`). How it probes,
shrinks and backs off, why, and how it is checked: docs/adaptive.md.
"""

from consumers.ai.limit.flight import NOT_SENT, OK, OVERLOAD, Permit
from consumers.ai.limit.permits import AdaptiveLimit
from consumers.ai.limit.settings import LimitSettings

__all__ = ["NOT_SENT", "OK", "OVERLOAD", "AdaptiveLimit", "LimitSettings", "Permit"]
