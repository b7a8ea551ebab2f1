"""A team's own work, as a `kind: python` stage calls it: a word count that raises on the posts a
test chooses (their text says "boom") and, for the ones that say "db-down", an exception the
spec declares a dependency's."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

RAISING_EVERY = 100  # the post of index 42 of every hundred says "boom"


class StoreDown(ConnectionError):
    """The work's own dependency is unreachable."""


def count_words(event: dict[str, Any]) -> dict[str, Any]:
    text = event["text"]
    if "boom" in text:
        raise ValueError(f"cannot count the words of {event['message_id']}")
    if "db-down" in text:
        raise StoreDown("word store unreachable")
    return {"words": len(text.split())}


def posts(rng: random.Random, run_id: str, index: int,
          reject_share: float) -> list[tuple[str, dict[str, Any]]]:
    """The load: one post per request, the raising ones at known indices."""
    text = "boom" if index % RAISING_EVERY == 42 else f"a note on item {rng.randrange(1000)}"
    return [("texts", {"message_id": str(uuid.uuid4()), "run_id": run_id, "text": text,
                       "produced_at": time.time()})]


SPEC = """
name: wordcount
key: message_id
topics:
  texts: {key: message_id}
  counts: {key: message_id}
stages:
  count:
    source: texts
    schema:
      type: object
      required: [message_id, run_id, text, produced_at]
      properties:
        message_id: {type: string}
        run_id: {type: string}
        text: {type: string}
        produced_at: {type: number}
    work:
      kind: python
      callable: tests.custom_work:count_words
      transient: ['tests.custom_work:StoreDown']
    retry: {max_attempts: 3}
    routes:
      - to: counts
        fields: {words: $words}
        status: completed
load:
  generator: tests.custom_work:posts
  measure: texts
"""
