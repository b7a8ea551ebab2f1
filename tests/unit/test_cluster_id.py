"""KRaft cluster ids the storage tool accepts."""

import base64

from infra import kafka_cluster


def test_a_cluster_id_never_starts_with_a_dash() -> None:
    # One random id in 64 would (its first base64 character is '-'); of 3,000, about 47.
    ids = [kafka_cluster.new_cluster_id() for _ in range(3000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids)


def test_a_cluster_id_is_a_uuid_in_url_safe_base64() -> None:
    cluster_id = kafka_cluster.new_cluster_id()
    assert len(cluster_id) == 22 and len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
