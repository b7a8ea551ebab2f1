"""Partitions needed for a target throughput, from measured per-partition rates.

partitions = max(ceil(t / t_produce), ceil(t / t_consume)), where t_produce and t_consume are
what one partition sustains on the produce and the consume side. For AI consumers one partition
is processed at most `concurrency per partition` calls at a time, each taking the service time,
so t_consume = concurrency / service time. Every rate is in the same unit (records/s, or MB/s
for all three). Partitions can only grow, and growing them changes which partition a key hashes
to, so a result above the current count comes with that warning.

Plain Python: provisioning (and so every DAG that provisions) and the Spark skew diagnosis
(`spark/partition_load.py`) share it without importing PySpark.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# Rates are measured figures: a quotient a hair above an integer (75.00000000000001) is that integer.
_EPSILON = 1e-9


@dataclass(frozen=True)
class SizingInput:
    """Measured rates and the goal; give consume_per_partition or concurrency and service time."""

    target: float
    produce_per_partition: float
    consume_per_partition: float | None = None
    concurrency_per_partition: float | None = None
    service_time_s: float | None = None
    current_partitions: int | None = None


def partitions_for(target: float, per_partition: float) -> int:
    """ceil(target / per_partition), at least 1."""
    if per_partition <= 0:
        raise ValueError("a per-partition rate must be positive")
    return max(1, math.ceil(target / per_partition - _EPSILON))


def consume_rate(inputs: SizingInput) -> tuple[float, str]:
    """t_consume and how it was obtained."""
    if inputs.consume_per_partition is not None:
        return inputs.consume_per_partition, "measured"
    if inputs.concurrency_per_partition is None or inputs.service_time_s is None:
        raise ValueError("give consume_per_partition, or concurrency_per_partition and service_time_s")
    if inputs.service_time_s <= 0:
        raise ValueError("service_time_s must be positive")
    return inputs.concurrency_per_partition / inputs.service_time_s, (
        f"{inputs.concurrency_per_partition:g} concurrent calls / {inputs.service_time_s:g} s service time")


def size(inputs: SizingInput) -> dict[str, Any]:
    """The partition count with its two terms, the reasoning as text, and a warning if any."""
    t = inputs.target
    t_consume, consume_source = consume_rate(inputs)
    by_produce = partitions_for(t, inputs.produce_per_partition)
    by_consume = partitions_for(t, t_consume)
    partitions = max(by_produce, by_consume)
    limiting = "both" if by_consume == by_produce else "consume" if by_consume > by_produce else "produce"
    reasoning = [
        f"produce side: ceil({t:g} / {inputs.produce_per_partition:g} per partition) = {by_produce}",
        f"consume side: t_consume = {t_consume:g} per partition ({consume_source}); "
        f"ceil({t:g} / {t_consume:g}) = {by_consume}",
        f"partitions = max({by_produce}, {by_consume}) = {partitions}, limited by: {limiting}",
    ]
    current = inputs.current_partitions
    warning = None
    if current is not None and partitions > current:
        warning = (f"growing from {current} to {partitions} partitions changes the partition of most keys "
                   "(hash mod partition count): per-key ordering does not hold across the change and "
                   "keyed state moves; partitions can never be removed again")
    elif current is not None:
        reasoning.append(f"the current {current} partitions suffice; partitions cannot shrink")
    return {"inputs": asdict(inputs), "t_consume": t_consume, "by_produce": by_produce,
            "by_consume": by_consume, "partitions": partitions, "limiting": limiting,
            "reasoning": reasoning, "warning": warning}
