"""Why a topic's partitions are unevenly loaded, and what to do: the hot-key sample and the
diagnosis, defined once.

- key sample: per partition, a sample of its records whose size gives a key carrying SHARE of
  the partition's records a share estimate within ERROR at CONFIDENCE (normal approximation of
  the binomial: n = z^2 p (1 - p) / e^2). The sample is taken in the scan's own pass, each record
  kept with the partition's `sample_rate`, so it costs no second read.
- a key's share: its sampled records / the partition's sampled records; its share of the topic:
  that share x the partition's records / the topic's records.
- diagnosis of a topic, from its records per partition, its keyless records per partition, the
  hottest partition's most frequent sampled key and, when given, the sizing formula's result
  (measure.sizing) for the rate the topic must carry:
  - skew beyond chance (max/mean above `figures.hashing_skew_bound`): `keyless_sticky` when
    keyless records make up at least EXPLAINS of the hottest partition's excess over the mean
    (and more of it than the top key), `hot_key` when the top key does, `unexplained` otherwise;
  - within chance: `too_few_partitions` when the sizing formula asks for more partitions than the
    topic has, `hashing_noise` when a partition still looks hot (max/mean above the hot
    threshold: what a small sample hashes to by chance), `balanced` otherwise;
  - `no_records` for a topic without records.

Plain Python, like measure.figures: the Spark job, the report and the gate page share it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from measure import figures

SHARE = 0.05  # the smallest key share the sample is sized for
ERROR = 0.01  # its largest share error, in share of the partition's records
CONFIDENCE = 0.99
# The sample is Bernoulli (each record kept or not): sized so that it falls short of the
# intended size only with probability 0.001 (z of 0.999, one-sided).
SHORTFALL_Z = 3.09
EXPLAINS = 0.5  # share of the hottest partition's excess a cause must account for
TOP_KEYS = 3  # keys kept per partition

CAUSES = ("hot_key", "keyless_sticky", "unexplained", "too_few_partitions", "hashing_noise", "balanced",
          "no_records")


def z_score(confidence: float) -> float:
    """The two-sided normal quantile: 2.576 for 0.99."""
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


def key_sample_size(share: float = SHARE, error: float = ERROR,
                    confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Sampled records per partition for a key of `share` to be estimated within `error` at
    `confidence`, with the reasoning as text."""
    if not 0 < share < 1 or error <= 0 or not 0 < confidence < 1:
        raise ValueError("share and confidence must be in (0, 1), error positive")
    z = z_score(confidence)
    records = math.ceil(z * z * share * (1 - share) / (error * error))
    return {"records": records, "share": share, "error": error, "confidence": confidence, "z": round(z, 4),
            "reasoning": [f"a key with {share:.0%} of a partition's records is estimated from n sampled "
                          "records with standard error sqrt(p (1 - p) / n)",
                          f"within {error:.0%} at {confidence:.0%} confidence: n = z^2 p (1 - p) / e^2 = "
                          f"{z:.4f}^2 x {share:g} x {1 - share:g} / {error:g}^2 = {records}"]}


def sample_rate(partition_records: int, sample: int) -> float:
    """The share of a partition's records to keep so that a Bernoulli sample has at least
    `sample` records but for a 0.001 chance; 1 (all of them) for a small partition."""
    if partition_records <= 0:
        return 1.0
    root = (SHORTFALL_Z + math.sqrt(SHORTFALL_Z ** 2 + 4 * sample)) / 2
    return min(1.0, root * root / partition_records)


def share_error(share: float, sampled: int, partition_records: int, confidence: float = CONFIDENCE) -> float:
    """Half-width of a sampled share's interval at `confidence`; 0 when every record was sampled."""
    if sampled <= 0:
        return 1.0
    if sampled >= partition_records:
        return 0.0
    return z_score(confidence) * math.sqrt(share * (1 - share) / sampled)


def top_keys(counted: Sequence[tuple[str, int]], sampled: int, partition_records: int,
             topic_records: int) -> list[dict[str, Any]]:
    """The sampled keys of one partition (key, sampled records), most frequent first, with their
    shares of the partition and the topic and the partition share's error."""
    keys = []
    for key, count in sorted(counted, key=lambda kc: (-kc[1], kc[0]))[:TOP_KEYS]:
        share = count / sampled if sampled else 0.0
        topic_share = share * partition_records / topic_records if topic_records else 0.0
        keys.append({"key": key, "sampled": count, "share": round(share, 5),
                     "share_error": round(share_error(share, sampled, partition_records), 5),
                     "topic_share": round(topic_share, 5)})
    return keys


def diagnose(counts: Sequence[int], keyless: Sequence[int], hottest_keys: Sequence[Mapping[str, Any]],
             *, hot_threshold: float = 2.0, sizing: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The cause of a topic's load (see the module docstring), the figures that decided it and a
    one-line recommendation. `hottest_keys` are top_keys of the hottest partition."""
    records, partitions = sum(counts), len(counts)
    if records == 0:
        return {"cause": "no_records", "recommendation": "no records to judge: none in the window",
                "figures": {"records": 0, "partitions": partitions}}
    max_over_mean, _ = figures.skew(counts)
    bound = figures.hashing_skew_bound(records, partitions)
    hot, _ = figures.hottest(counts)
    assert max_over_mean is not None and hot is not None  # None only without records
    mean = records / partitions
    excess = counts[hot] - mean
    top = hottest_keys[0] if hottest_keys else None
    key_records = top["share"] * counts[hot] if top else 0.0
    decided: dict[str, Any] = {
        "records": records, "partitions": partitions, "max_over_mean": round(max_over_mean, 4),
        "hashing_bound": round(bound, 4), "hottest_partition": hot,
        "hottest_excess_records": round(excess, 1), "keyless_share": round(sum(keyless) / records, 5),
        "hottest_keyless": keyless[hot],
        "top_key": dict(top) if top else None}
    if sizing is not None:
        decided["sizing_partitions"] = sizing["partitions"]
        decided["sizing"] = list(sizing["reasoning"])

    def verdict(cause: str, recommendation: str) -> dict[str, Any]:
        return {"cause": cause, "recommendation": recommendation, "figures": decided}

    if max_over_mean > bound:
        if keyless[hot] >= EXPLAINS * excess and keyless[hot] >= key_records:
            return verdict("keyless_sticky",
                           f"{sum(keyless) / records:.0%} of the records have no key and partition {hot} "
                           f"holds {max_over_mean:.2f}x the mean: the sticky partitioner puts a batch "
                           "window's keyless records on one partition; give each event a key (a UUID) or "
                           "partition them round-robin")
        if top and key_records >= EXPLAINS * excess:
            return verdict("hot_key",
                           f"key {top['key']!r} carries {top['topic_share']:.1%} of the records "
                           f"({top['share']:.0%} of partition {hot}): more partitions will not spread it; "
                           "split the key or re-key the work")
        return verdict("unexplained",
                       f"partition {hot} holds {max_over_mean:.2f}x the mean, beyond chance "
                       f"({bound:.2f}), and neither one key nor keyless records explain it: check the "
                       "producer's partitioner and the top keys of the hot partitions")
    if sizing is not None and sizing["partitions"] > partitions:
        return verdict("too_few_partitions",
                       f"even load, but the sizing formula asks for {sizing['partitions']} partitions for "
                       f"{sizing['inputs']['target']:g} records/s and the topic has {partitions}: grow it to "
                       f"{sizing['partitions']} (keys move to other partitions when it grows)")
    if max_over_mean > hot_threshold:
        return verdict("hashing_noise",
                       f"max/mean {max_over_mean:.2f} is within what hashing {records} records over "
                       f"{partitions} partitions gives by chance ({bound:.2f}): nothing to fix; measure "
                       "with more records")
    return verdict("balanced", f"max/mean {max_over_mean:.2f}, within chance ({bound:.2f}): nothing to fix")
