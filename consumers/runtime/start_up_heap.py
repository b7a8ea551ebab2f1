"""A long-running process's start-up heap, put out of the garbage collector's reach.

For a process that is a fleet or a load source and nothing else, once it is built: the
collector's oldest generation otherwise walks every object alive since start-up (modules,
settings, clients), and a spawned child holds its parent's imports too, so a full collection
stopped every member thread, and the load source between stamping a request and sending it
(docs/design.md#fleets-freeze-their-start-up-heap). What the process allocates afterwards is
collected as before.
"""

from __future__ import annotations

import gc


def freeze() -> None:
    """Collect what start-up left behind, then move every object alive now to the permanent
    generation."""
    gc.collect()
    gc.freeze()
