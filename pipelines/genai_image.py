"""The reference scenario's load: an upload notification, then the user's style choice."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

STYLES = ("minimal", "corporate", "playful", "academic", "dark")
TOPICS = ("quarterly results", "team offsite", "product launch", "thesis defence")


def description(rng: random.Random, reject_share: float) -> str:
    """A slide-deck description; the stand-in checking AI rejects those saying 'forbidden'."""
    topic = rng.choice(TOPICS)
    return f"forbidden {topic}" if rng.random() < reject_share else f"slides about the {topic}"


def request(rng: random.Random, run_id: str, index: int,
            reject_share: float) -> list[tuple[str, dict[str, Any]]]:
    """One request: the storage backend's upload notification and the bot's style choice."""
    request_id = str(uuid.uuid4())  # unique across runs, whatever the seed
    upload = {"request_id": request_id, "run_id": run_id, "user_id": f"user-{rng.randrange(10_000)}",
              "object_id": f"upload/{index}.png", "produced_at": time.time()}
    style = {"request_id": request_id, "run_id": run_id, "style": rng.choice(STYLES),
             "description": description(rng, reject_share), "produced_at": time.time()}
    return [("intake", upload), ("style", style)]
