"""The hot-key sample and the skew diagnosis (measure.skew) on hand-computed inputs."""

from __future__ import annotations

import math

import pytest

from measure import figures, skew
from measure.sizing import SizingInput, size


def test_sample_size_for_a_five_percent_key_within_one_point() -> None:
    # z(0.99) = 2.5758; 2.5758^2 x 0.05 x 0.95 / 0.01^2 = 6.6349 x 0.0475 / 0.0001 = 3151.6 -> 3152
    sample = skew.key_sample_size(0.05, 0.01, 0.99)
    assert sample["records"] == 3152 and sample["z"] == pytest.approx(2.5758, abs=1e-4)
    assert sample["reasoning"][-1].endswith("= 3152")
    # at 95 %: 1.96^2 x 0.0475 / 0.0001 = 1824.8 -> 1825
    assert skew.key_sample_size(0.05, 0.01, 0.95)["records"] == 1825
    with pytest.raises(ValueError):
        skew.key_sample_size(0.05, 0.0)


def test_sample_rate_keeps_enough_records_but_for_a_small_chance() -> None:
    # n = 3152: sqrt(kept) = (3.09 + sqrt(3.09^2 + 4 x 3152)) / 2 = (3.09 + 112.33) / 2 = 57.71,
    # kept = 57.71^2 = 3330.5
    assert skew.sample_rate(1_000_000, 3152) * 1_000_000 == pytest.approx(3330.5, abs=0.5)
    assert skew.sample_rate(3000, 3152) == 1.0  # a small partition: all of it
    assert skew.sample_rate(0, 3152) == 1.0
    # 3330.5 kept on average, sd sqrt(3330.5) = 57.7: 3152 is 3.09 sd below
    kept = skew.sample_rate(1_000_000, 3152) * 1_000_000
    assert (kept - 3152) / math.sqrt(kept) == pytest.approx(3.09, abs=0.01)


def test_share_error_at_the_sized_sample_is_under_one_point() -> None:
    assert skew.share_error(0.05, 3152, 10**6) == pytest.approx(2.5758 * math.sqrt(0.0475 / 3152), rel=1e-4)
    assert skew.share_error(0.05, 3152, 10**6) < 0.01
    assert skew.share_error(0.3, 500, 500) == 0.0  # every record sampled: exact


def test_top_keys_shares_of_partition_and_topic() -> None:
    keys = skew.top_keys([("b", 10), ("a", 60), ("c", 10), ("d", 1)], sampled=100, partition_records=1000,
                         topic_records=4000)
    assert [(k["key"], k["sampled"], k["share"], k["topic_share"]) for k in keys] == [
        ("a", 60, 0.6, 0.15), ("b", 10, 0.1, 0.025), ("c", 10, 0.1, 0.025)]


def key(name: str, share: float, topic_share: float) -> dict:
    return {"key": name, "sampled": 100, "share": share, "share_error": 0.0, "topic_share": topic_share}


def test_a_hot_key_explains_its_partition() -> None:
    # 8 partitions of 100, key k adds 300 to partition 2: 400 of 1100 records, 300 / 400 of partition 2
    counts = [100, 100, 400, 100, 100, 100, 100, 100]
    result = skew.diagnose(counts, [0] * 8, [key("k", 0.75, 300 / 1100)])
    assert result["cause"] == "hot_key" and "'k'" in result["recommendation"]
    assert result["figures"]["hottest_partition"] == 2
    assert result["figures"]["max_over_mean"] == pytest.approx(400 / (1100 / 8), abs=1e-4)


def test_keyless_records_on_a_sticky_partition() -> None:
    counts, keyless = [900, 20, 20, 20], [900, 20, 20, 20]
    result = skew.diagnose(counts, keyless, [])
    assert result["cause"] == "keyless_sticky" and result["figures"]["keyless_share"] == 1.0


def test_skew_beyond_chance_that_no_key_explains() -> None:
    # partition 0 holds 600 of 900, its top key 10 % of it: 60 records against an excess of 375
    result = skew.diagnose([600, 100, 100, 100], [0] * 4, [key("a", 0.1, 60 / 900)])
    assert result["cause"] == "unexplained"


def test_even_load_with_too_few_partitions_for_the_rate() -> None:
    sizing = size(SizingInput(target=2000, produce_per_partition=50_000, consume_per_partition=100,
                              current_partitions=4))
    assert sizing["partitions"] == 20  # ceil(2000 / 100)
    result = skew.diagnose([1000, 1010, 990, 1000], [0] * 4, [], sizing=sizing)
    assert result["cause"] == "too_few_partitions" and "20 partitions" in result["recommendation"]
    assert skew.diagnose([1000, 1010, 990, 1000], [0] * 4, [])["cause"] == "balanced"


def test_hashing_noise_and_balanced() -> None:
    # 40 records over 16 partitions: a partition of 6 is 2.4x the mean, within the bound by chance
    counts = [6, 4, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1]
    assert sum(counts) == 40 and figures.hashing_skew_bound(40, 16) > 2.4
    assert skew.diagnose(counts, [0] * 16, [])["cause"] == "hashing_noise"
    assert skew.diagnose([10, 11, 9, 10], [0] * 4, [])["cause"] == "balanced"
    assert skew.diagnose([0, 0], [0, 0], [])["cause"] == "no_records"
