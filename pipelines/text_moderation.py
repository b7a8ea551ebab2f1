"""Load for the text moderation pipeline: short posts, a share of them spam."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

SUBJECTS = ("the release notes", "a support question", "the meetup", "a bug report", "the roadmap")


def request(rng: random.Random, run_id: str, index: int,
            reject_share: float) -> list[tuple[str, dict[str, Any]]]:
    """One post; the stand-in moderation model blocks those that say 'spam'."""
    subject = rng.choice(SUBJECTS)
    text = f"buy now spam about {subject}" if rng.random() < reject_share else f"a note on {subject}"
    return [("texts", {"message_id": str(uuid.uuid4()), "run_id": run_id,
                       "author": f"author-{rng.randrange(1000)}", "text": text,
                       "produced_at": time.time()})]
