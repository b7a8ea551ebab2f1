"""Load for the support tickets pipeline: tickets of four kinds, a share of them spam."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

TICKETS = (
    ("Charged twice", "I was charged twice for my subscription this month and would like a refund."),
    ("App crashes on start", "Since the last update the app crashes on start with an error on my phone."),
    ("Exporting a report", "How do I export last quarter's report as a spreadsheet for my manager?"),
    ("Invoice address", "Our invoice shows the old company address; where can we change it?"),
    ("Sharing a board", "Is there a way to share a board with a colleague who has no account yet?"),
)


def request(rng: random.Random, run_id: str, index: int,
            reject_share: float) -> list[tuple[str, dict[str, Any]]]:
    """One ticket; the stand-in small model calls those that say 'buy now' spam."""
    subject, body = rng.choice(TICKETS)
    if rng.random() < reject_share:
        subject, body = "Great offer", f"Buy now: {body.lower()}"
    return [("tickets", {"ticket_id": str(uuid.uuid4()), "run_id": run_id,
                         "customer": f"customer-{rng.randrange(10_000)}", "subject": subject,
                         "body": body, "produced_at": time.time()})]
