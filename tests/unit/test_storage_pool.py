"""How many connections a fleet's pool takes from a server that others share."""

from consumers.runtime.storage import LEFT_FOR_OTHERS, fitted_pool_size


def test_a_server_with_room_gives_the_pool_all_it_wants() -> None:
    assert LEFT_FOR_OTHERS == 16  # the figures below are worked out for 16
    assert fitted_pool_size(48, free=200) == 48
    assert fitted_pool_size(48, free=64) == 48  # exactly 48 + 16 free


def test_a_crowded_server_gives_what_is_free_beyond_the_reserve() -> None:
    assert fitted_pool_size(48, free=63) == 47
    assert fitted_pool_size(48, free=20) == 4


def test_a_full_server_still_gets_asked_for_one_so_the_fleet_fails_loudly() -> None:
    assert fitted_pool_size(48, free=16) == 1
    assert fitted_pool_size(48, free=0) == 1
