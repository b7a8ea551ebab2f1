"""The adaptive limit, step by step on a hand-driven clock, then against a simulated service."""

from __future__ import annotations

import heapq
import math
import threading
import time

import pytest

from consumers.concurrency_limit import OK, OVERLOAD, AdaptiveLimit, Permit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def take(limit: AdaptiveLimit, n: int) -> list[Permit]:
    assert limit.spare() >= n, (limit.spare(), n)  # acquire would wait for ever on this thread
    return [limit.acquire() for _ in range(n)]


def refill(limit: AdaptiveLimit, permits: list[Permit]) -> None:
    """A caller with work to spare: it takes every permit free."""
    permits.extend(limit.acquire() for _ in range(limit.spare()))


def test_acquire_waits_while_the_limit_is_reached() -> None:
    limit = AdaptiveLimit(initial=2, clock=Clock())
    first, _ = take(limit, 2)
    assert limit.spare() == 0
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (limit.acquire(), got.set()))
    waiter.start()
    assert not got.wait(0.2)
    limit.release(first, "http_5xx")  # an outcome that teaches nothing still frees the permit
    assert got.wait(2)
    waiter.join()
    assert (limit.limit, limit.in_flight) == (2, 2)


def test_each_freed_permit_goes_to_a_waiter_and_none_is_left_waiting() -> None:
    limit = AdaptiveLimit.fixed(2)
    held = take(limit, 2)
    acquired: list[Permit] = []
    lock = threading.Lock()

    def wait_for_permit() -> None:
        permit = limit.acquire()
        with lock:
            acquired.append(permit)

    waiters = [threading.Thread(target=wait_for_permit) for _ in range(6)]
    for waiter in waiters:
        waiter.start()
    for freed in range(1, 7):  # each release lets exactly one more waiter through
        limit.release(held.pop(), "http_5xx")
        deadline = time.monotonic() + 2
        while len(acquired) < freed and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # time for a second waiter to slip through, were one let in
        with lock:
            assert len(acquired) == freed
            held.append(acquired[-1])
    for waiter in waiters:
        waiter.join(2)
        assert not waiter.is_alive()
    assert limit.in_flight == 2


def test_a_429_brings_the_limit_down_to_the_calls_still_in_flight() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=8, clock=clock)
    permits = take(limit, 8)
    clock.now = 0.01
    limit.release(permits[0], OVERLOAD)
    assert limit.limit == 7  # the service held the 7 others


def test_saturated_successes_grow_the_limit_one_call_each_paced_by_the_latency() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=4, clock=clock)
    permits = take(limit, 4)
    clock.now = 4.0  # latency 4 s
    limit.release(permits.pop(0), OK)  # in use, nothing refused: slow start, +1
    assert limit.limit == 5
    permits += take(limit, limit.spare())
    # Growth waits latency / limit / 2 = 0.4 s: a success at the same instant adds nothing.
    limit.release(permits.pop(0), OK)
    assert limit.limit == 5
    permits += take(limit, limit.spare())
    clock.now = 4.4
    limit.release(permits.pop(0), OK)
    assert limit.limit == 6


def measured(limit: AdaptiveLimit, trip: float) -> AdaptiveLimit:
    """`limit` as if a 429 had measured `trip` as its round trip, the rest of its state untouched
    (a real 429 would cut and hold it too)."""
    limit._trip = trip
    return limit


def test_calls_ending_together_grow_the_limit_by_the_saved_tokens_only() -> None:
    clock = Clock()
    limit = measured(AdaptiveLimit(initial=32, clock=clock), trip=0.001)
    permits = take(limit, 32)
    # 10 of the 32 calls of 4 s end within 45 ms (5 ms apart, past the 4 round trips of 1 ms a
    # step waits): 32 / 8 = 4 tokens saved, and a token every latency / limit / 2 = 1/18 s since.
    for end in range(10):
        clock.now = 4.0 + 0.005 * end
        limit.release(permits.pop(0), OK)
        refill(limit, permits)
    assert limit.limit == 36
    for end in range(3):  # 4.2 s: 0.75 tokens left and 0.155 s x 18 more, 3.5: three steps
        clock.now = 4.2 + 0.005 * end
        limit.release(permits.pop(0), OK)
        refill(limit, permits)
    assert limit.limit == 39


def test_until_a_429_is_measured_growth_doubles_at_most_every_1_5_s_in_steps_20_ms_apart() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=20, clock=clock)
    permits = take(limit, 20)
    clock.now = 0.5  # 20 calls of 0.5 s end at once: one step, though 20 / 8 tokens are saved
    for _ in range(20):
        limit.release(permits.pop(0), OK)
        refill(limit, permits)
    assert limit.limit == 21
    for end in range(1, 41):  # then a call ends every 25 ms for 1 s
        clock.now = 0.5 + 0.025 * end
        limit.release(permits.pop(0), OK)
        refill(limit, permits)
    # A token every 1.5 s / limit: dL/dt = L / 1.5, so 21 x e^(1 / 1.5) = 40.9, and the 1.5
    # saved tokens left. Paced by the latency (a token every 0.25 s / limit), every call that
    # ended would have stepped: 61.
    assert 40 <= limit.limit <= 43, limit.limit


def test_a_step_waits_until_the_last_one_is_taken() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=32, clock=clock)
    permits = take(limit, 32)
    for end in range(10):  # tokens enough, but the caller has not started a call at 33 yet
        clock.now = 1.0 + 0.1 * end
        limit.release(permits.pop(0), OK)
    assert limit.limit == 33
    refill(limit, permits)  # the calls start: 33 in flight, the step is taken
    limit.release(permits.pop(0), OK)
    assert limit.limit == 34


def test_a_limit_not_in_use_does_not_grow() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=8, clock=clock)
    permit = limit.acquire()
    clock.now = 1.0
    limit.release(permit, OK)
    assert limit.limit == 8


def test_after_a_429_the_limit_holds_for_two_rounds_then_probes_by_one() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=4, hold_rounds=2, clock=clock)
    permits = take(limit, 4)
    clock.now = 0.01
    limit.release(permits.pop(), OVERLOAD)  # limit 3, hold 2 rounds x 3 = 6 successes
    assert limit.limit == 3
    grown_at = None
    for success in range(1, 12):
        clock.now += 1.0
        limit.release(permits.pop(0), OK)
        refill(limit, permits)  # keep the limit in use
        if limit.limit > 3 and grown_at is None:
            grown_at = success
    # 6 held, then 1/3 per success for half a round (the 7th and 8th), then 4 x 1/3 capped at
    # one call per success: 3 + 2/3 + 1 at the 9th, + 1 at the 10th and 11th.
    assert grown_at == 9
    assert limit.limit == 6


def test_a_second_429_within_a_latency_of_the_cut_cuts_by_the_backoff() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=10, backoff=0.5, clock=clock)
    permits = take(limit, 10)  # levels 1 to 10
    clock.now = 1.0
    limit.release(permits.pop(0), OK)  # latency seen: 1 s; the service served level 1
    refused = limit.acquire()  # level 10
    clock.now = 1.01
    limit.release(refused, OVERLOAD)  # level 10 refused, 9 in flight: limit 9
    assert limit.limit == 9
    clock.now = 1.02
    limit.release(permits.pop(0), OK)  # its round trip has passed again: back to 9
    sent_after_cut = limit.acquire()  # level 9
    clock.now = 1.025
    limit.release(permits.pop(0), OK)
    clock.now = 1.03
    # Refused 0.02 s after the cut with 7 in flight, more than a tenth and the margin (one call in
    # transit: one ended while the second 429 was out) under the 9 the episode began with: 7 x 0.5.
    limit.release(sent_after_cut, OVERLOAD)
    assert limit.limit == 3


# Level 7 refused, a tenth and the margin (a call) under the 10 served: the service shrank, 8 in
# flight x 0.5. Level 9: 9 + 1 is not under 10 x 0.9, and calls that end together are replaced
# before the service has counted them out, so a level or two says nothing: 8 in flight, no halving.
@pytest.mark.parametrize(("refused_level", "expected"), [(7, 4), (9, 8)])
def test_a_429_a_tenth_under_a_level_served_since_the_cut_cuts_by_the_backoff(
        refused_level: int, expected: int) -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=10, backoff=0.5, clock=clock)
    permits = take(limit, 10)  # levels 1 to 10
    clock.now = 1.0
    limit.release(permits.pop(), OK)  # level 10 served; +1 of growth: limit 11
    assert limit.limit == 11
    clock.now = 1.01
    limit.release(permits.pop(refused_level - 1), OVERLOAD)
    assert limit.limit == expected


def test_refusals_of_a_few_probes_over_the_limit_do_not_cut_by_the_backoff() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=20, backoff=0.5, clock=clock)
    permits = take(limit, 20)
    clock.now = 1.0
    limit.release(permits.pop(0), OK)  # latency seen: 1 s; level 1 served
    permits.append(limit.acquire())
    clock.now = 1.01
    limit.release(permits.pop(), OVERLOAD)  # level 20 refused, 19 held: limit 19
    clock.now = 1.02
    limit.release(permits.pop(0), OK)  # its round trip has passed again: back to 19
    probe = limit.acquire()  # sent after the cut, refused too: 18 held, not a tenth under 19
    clock.now = 1.03
    limit.release(probe, OVERLOAD)
    assert limit.limit == 18


def served_at_64(clock: Clock) -> tuple[AdaptiveLimit, list[Permit]]:
    """64 calls in flight since t=0 and the one at level 64 served at t=1 (a latency of 1 s):
    limit 65, 63 calls left in flight."""
    limit = AdaptiveLimit(initial=64, backoff=0.5, clock=clock)
    permits = take(limit, 64)
    clock.now = 1.0
    limit.release(permits.pop(), OK)
    return limit, permits


def test_after_a_429_calls_that_end_are_not_replaced_for_its_round_trip() -> None:
    clock = Clock()
    limit, permits = served_at_64(clock)
    refused = limit.acquire()  # level 64
    clock.now = 1.01
    limit.release(refused, OVERLOAD)  # a round trip of 0.01 s; 63 in flight: limit 63
    assert (limit.limit, limit.spare()) == (63, 0)
    clock.now = 1.015
    limit.release(permits.pop(0), OK)  # within the round trip: not replaced
    assert (limit.limit, limit.spare()) == (62, 0)
    clock.now = 1.021
    limit.release(permits.pop(0), OK)  # past it, nothing else refused: one call more, then doubling
    assert (limit.limit, limit.in_flight) == (62, 61)


def test_refusals_of_calls_sent_before_the_drain_at_levels_served_cut_by_the_backoff_at_the_third() -> None:
    clock = Clock()
    limit, permits = served_at_64(clock)
    sent = []
    for _ in range(3):  # each at level 64, on its way when the service halves
        sent.append(limit.acquire())
        limit.release(permits.pop(0), OK)
    for i, permit in enumerate(sent):
        clock.now = 1.01 + i * 0.001
        limit.release(permit, OVERLOAD)
    # The first brought the limit to the 62 in flight and no call is replaced since; the next two,
    # sent before it, were refused at the level the service had served: it shrank. (62 - 2) x 0.5
    assert limit.limit == 30


def test_a_latency_cut_is_not_repeated_for_calls_sent_before_it() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=64, maximum=64, latency_tolerance=1.5, clock=clock)
    first = take(limit, 64)
    clock.now = 1.0
    for permit in first:  # baseline: a round of 64 calls of 1 s
        limit.release(permit, OK)
    queued = take(limit, 64)
    clock.now = 2.5
    for permit in queued[:32]:
        limit.release(permit, OK)
    late = take(limit, 32)  # sent before the cut below, queued behind it
    clock.now = 3.0
    for permit in queued[32:]:
        limit.release(permit, OK)
    assert limit.limit == 36  # a round of 1.5 s and 2 s: 64 x 1 / 1.75 = 36.6
    clock.now = 4.5
    for permit in late:  # 2 s each, but sent before the cut: not in a round
        limit.release(permit, OK)
    fresh = take(limit, 8)
    clock.now = 5.5
    for permit in fresh:
        limit.release(permit, OK)
    # With them, 32 latencies of 2 s and 5 of 1 s made a round of 1.86 s: cut again to 19.
    assert limit.limit == 36


def test_a_permit_taken_before_a_cut_is_given_back_unsent_and_waits_for_the_new_limit() -> None:
    clock = Clock()
    limit, permits = served_at_64(clock)  # limit 65, 63 in flight
    assert limit.renew(permits[0]) is permits[0]  # no cut since it was taken: sent as it is
    late = limit.acquire()  # level 64: its thread runs again only after the 429 below
    probe = limit.acquire()  # level 65
    clock.now = 1.01
    limit.release(probe, OVERLOAD)  # 64 in flight, the late try counted: the drain runs to 1.02
    assert (limit.limit, limit.in_flight) == (64, 64)
    renewed: list[Permit] = []
    waiter = threading.Thread(target=lambda: renewed.append(limit.renew(late)))
    waiter.start()
    deadline = time.monotonic() + 2
    while limit.in_flight != 63 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    # Given back unsent and not replaced while the drain runs: the try waits.
    assert (limit.limit, limit.in_flight, renewed) == (63, 63, [])
    clock.now = 1.021
    limit.release(permits.pop(), OK)  # the drain is over: one call more than the 62 in flight
    waiter.join(2)
    assert not waiter.is_alive()
    assert renewed[0].generation != late.generation
    assert (limit.limit, limit.in_flight) == (63, 63)


def test_after_the_drain_the_limit_comes_back_a_step_at_a_time_and_a_refused_step_tells_a_shrink() -> None:
    clock = Clock()
    limit, permits = served_at_64(clock)
    sent = []
    for _ in range(2):  # only two calls at level 64 on their way when the service halves
        sent.append(limit.acquire())
        limit.release(permits.pop(0), OK)
    clock.now = 1.01
    limit.release(sent[0], OVERLOAD)  # a round trip of 0.01 s: the drain runs until 1.02
    clock.now = 1.011
    limit.release(sent[1], OVERLOAD)  # the second refusal at a level served: not yet a shrink
    for i in range(5):  # calls that end during the drain are not replaced
        clock.now = 1.012 + i * 0.001
        limit.release(permits.pop(0), OK)
    assert (limit.limit, limit.in_flight) == (56, 56)
    clock.now = 1.021
    limit.release(permits.pop(0), OK)  # the drain is over: one call more, not the 61 it had
    assert (limit.limit, limit.in_flight) == (56, 55)
    step = limit.acquire()
    clock.now = 1.022
    limit.release(step, OVERLOAD)  # refused: the third at a level served, it shrank
    # The level after the drain: 62 in flight at the first refusal, less the two refused since,
    # halved: 30. Coming back to 61 at once had sent six calls to be refused, not one.
    assert limit.limit == 30


def test_after_the_drain_the_steps_double_each_round_trip_back_to_the_level() -> None:
    clock = Clock()
    limit, permits = served_at_64(clock)
    probe = limit.acquire()  # level 64, past the service's limit, which did not change
    clock.now = 1.01
    limit.release(probe, OVERLOAD)  # 63 in flight: the drain runs until 1.02
    for i in range(6):  # six calls end during the drain
        clock.now = 1.011 + i * 0.001
        limit.release(permits.pop(0), OK)
    assert limit.limit == 57
    limits = []
    for at in (1.021, 1.031, 1.041, 1.051):  # a call ends each round trip; each step is taken
        clock.now = at
        limit.release(permits.pop(0), OK)
        limits.append(limit.limit)
        while limit.spare():
            permits.append(limit.acquire())
    # In flight after each release, plus the step: 56 + 1, 56 + 2, 57 + 4, then 60 + 8 capped at
    # the drain's level (the 63 in flight when the 429 came)
    assert limits == [57, 58, 61, 63]


def test_refusals_at_levels_the_service_served_cut_by_the_backoff_at_the_third() -> None:
    clock = Clock()
    limit, permits = served_at_64(clock)
    permits.append(limit.acquire())  # level 64
    # The service halves with 64 in flight: as each call ends, its replacement is refused at once,
    # at a level less than a margin (one call) under the one served: the first two only bring
    # the limit down to the calls in flight.
    for at, expected in ((1.01, 63), (1.02, 62)):
        clock.now = at
        limit.release(permits.pop(0), OK)
        replacement = limit.acquire()
        clock.now += 0.001
        limit.release(replacement, OVERLOAD)
        assert limit.limit == expected
    clock.now = 1.03
    limit.release(permits.pop(0), OK)
    replacement = limit.acquire()  # level 62
    clock.now = 1.031
    limit.release(replacement, OVERLOAD)  # the third in one latency: it shrank. 61 x 0.5
    assert limit.limit == 30


def test_a_probe_refused_a_while_before_the_service_halves_is_not_its_episode() -> None:
    clock = Clock()
    limit, permits = served_at_64(clock)
    permits += take(limit, 2)  # levels 64 and 65: the last a probe
    clock.now = 1.001
    limit.release(permits.pop(), OVERLOAD)  # refused: limit 64, the calls in flight
    assert limit.limit == 64
    # 0.96 latencies later the service halves, with 64 of ours in flight: each call that ends is
    # replaced and refused. These refusals are an episode of their own (the probe's was 0.96 s
    # before, over a quarter latency): it began with 63 in flight, so the service held at least
    # 62 of them (a margin of one call). Refused at 64 and 63, then at 62, 61 and 60: the third at
    # a level it held, so it shrank: 59 in flight x 0.5.
    for at, expected in ((1.96, 63), (1.98, 62), (2.0, 61), (2.02, 60), (2.04, 29)):
        clock.now = at
        limit.release(permits.pop(0), OK)
        replacement = limit.acquire()
        clock.now += 0.001
        limit.release(replacement, OVERLOAD)
        assert limit.limit == expected, at


def test_successes_of_tries_sent_before_a_cut_do_not_grow_the_limit() -> None:
    clock = Clock()
    limit, permits = served_at_64(clock)
    clock.now = 1.01
    # Level 56 refused, a tenth and a call under the 64 served: it shrank. 62 in flight x 0.5
    limit.release(permits.pop(55), OVERLOAD)
    assert limit.limit == 31
    for i, permit in enumerate(permits):  # the calls of before end; they held the old level
        clock.now = 1.02 + i * 0.01
        limit.release(permit, OK)
    assert limit.limit == 31


def test_a_429_for_a_try_sent_before_the_cut_only_counts_the_call_it_freed() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=10, backoff=0.5, clock=clock)
    permits = take(limit, 10)
    clock.now = 0.01
    limit.release(permits.pop(), OVERLOAD)  # limit 9
    limit.release(permits.pop(), OVERLOAD)  # sent before that cut: 8 in flight, limit 8, no backoff
    assert limit.limit == 8


def shrunk(clock: Clock) -> AdaptiveLimit:
    """A limiter whose service served 20 calls, then refused one sent at level 16 with nothing
    ending on the way (a margin of one call): limit 4 (15 in flight x 0.3), plateau 20, lowest
    refused level 16, the calls of before all ended at t=1.02."""
    limit = AdaptiveLimit(initial=20, backoff=0.3, clock=clock)
    permits = take(limit, 20)
    clock.now = 1.0
    for _ in range(5):
        limit.release(permits.pop(), OK)  # levels 20 to 16 served: +1 of growth, limit 21
    refused = limit.acquire()  # level 16
    clock.now = 1.01
    limit.release(refused, OVERLOAD, retry_after_s=0.5)  # 16 + 1 < 20 x 0.9: it shrank. 15 x 0.3
    clock.now = 1.02
    for permit in permits:
        limit.release(permit, OK)  # sent before the cut: no growth, no return to the plateau
    assert (limit.limit, limit.in_flight) == (4, 0)
    return limit


def test_under_the_plateau_the_refused_level_is_probed_once_a_latency_up_to_the_margin() -> None:
    clock = Clock()
    limit = shrunk(clock)
    permits = take(limit, 4)
    clock.now = 1.5  # within the Retry-After (until 1.51): no growth
    limit.release(permits.pop(0), OK)
    permits.append(limit.acquire())
    assert limit.limit == 4
    clock.now = 2.0  # after it: a call of growth per token (0.48 s latency / 4 / 2 apart)
    limit.release(permits.pop(0), OK)
    permits.append(limit.acquire())
    assert limit.limit == 5
    probe = limit.acquire()  # level 5
    clock.now = 2.005
    limit.release(probe, OVERLOAD, retry_after_s=0.1)  # the service still holds 4: limit 4
    assert limit.limit == 4
    clock.now = 2.1
    for _ in range(4):  # sent before that cut: their successes say nothing of the limit since
        limit.release(permits.pop(0), OK)
        permits.append(limit.acquire())
    assert limit.limit == 4
    # The next probe waits a latency (0.48 s, more than the Retry-After), then goes no higher
    # than the margin (one call) over the level refused, 6, however many tokens there are: a try
    # admitted there would say the service grew.
    for at, expected in ((2.3, 4), (2.5, 5), (2.6, 6), (2.601, 6), (2.602, 6)):
        clock.now = at
        limit.release(permits.pop(0), OK)
        refill(limit, permits)
        assert limit.limit == expected, at


def probe_out(clock: Clock) -> tuple[AdaptiveLimit, list[Permit]]:
    """`shrunk`, then a probe refused at level 5, and one at 6 sent at 3.04, out until 3.089 (4
    round trips of a 429, 0.036 s, or 5 % of the latency, 0.049 s) before it is taken for
    admitted. At 3.06: returns it and the permits in flight (limit 6, all of it taken)."""
    limit = shrunk(clock)  # a 429's round trip: 0.009 s; the lowest latency 0.98 s
    permits = take(limit, 4)
    clock.now = 2.0
    limit.release(permits.pop(0), OK)  # growth: limit 5
    permits.append(limit.acquire())
    probe = limit.acquire()  # level 5
    clock.now = 2.005
    limit.release(probe, OVERLOAD)  # refused: the lowest refused level is now 5; next in 0.98 s
    assert limit.limit == 4
    clock.now = 2.1
    for _ in range(4):  # tries sent before that cut end: no growth
        limit.release(permits.pop(0), OK)
        permits.append(limit.acquire())
    clock.now = 3.0
    limit.release(permits.pop(0), OK)  # limit 5 again
    permits += take(limit, 2)  # levels 4 and 5
    clock.now = 3.04  # the last step's refusal would be back (4 round trips of 0.009 s)
    limit.release(permits.pop(0), OK)  # and 6: probes go up to the margin (a call) over 5
    permits += take(limit, 2)  # levels 5 and 6: the probe
    clock.now = 3.06  # out 0.02 s: not yet taken for admitted
    limit.release(permits.pop(0), OK)
    permits.append(limit.acquire())
    assert (limit.limit, limit.spare()) == (6, 0)
    return limit, permits


def admitted_probe(clock: Clock) -> tuple[AdaptiveLimit, list[Permit]]:
    """`probe_out`, then a call ending at 3.1: the service admitted the probe, and the return to
    the plateau (20), at most 2 x 6, has begun. Returns it and the permits in flight."""
    limit, permits = probe_out(clock)
    clock.now = 3.1
    limit.release(permits.pop(0), OK)
    return limit, permits


def test_a_probe_is_taken_for_admitted_while_callers_wait_and_no_call_ends() -> None:
    clock = Clock()
    limit, _ = probe_out(clock)
    got: list[Permit] = []
    waiter = threading.Thread(target=lambda: got.append(limit.acquire()), daemon=True)
    waiter.start()
    clock.now = 3.1  # past 3.089, and no call has ended: the waiter's own wait ends
    waiter.join(2)
    assert not waiter.is_alive() and got
    assert limit.limit == 7  # the return's first step


def test_a_step_waits_for_the_longest_refusal_of_the_last_two_latencies() -> None:
    clock = Clock()
    limit = shrunk(clock)  # one 429 so far, 0.01 s on its way; the lowest latency 0.98 s
    permits = take(limit, 4)
    clock.now = 2.0
    limit.release(permits.pop(0), OK)
    probe = limit.acquire()
    clock.now = 2.5  # refused after 0.5 s: the machine was loaded
    limit.release(probe, OVERLOAD)
    # The mean round trip: 0.01 + 0.2 x (0.5 - 0.01) = 0.108, 4 of them 0.432: the 0.5 s is longer.
    assert limit._step_wait() == pytest.approx(0.5)
    clock.now = 4.5  # two latencies (1.96 s) later that refusal is forgotten, the mean is not
    limit.release(permits.pop(0), OK)
    assert limit._step_wait() == pytest.approx(0.432)


def test_the_margin_counts_the_calls_served_while_a_429_was_out_not_the_refused() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=8, clock=clock)
    permits = take(limit, 3)
    clock.now = 1.0
    limit.release(permits.pop(0), OK)  # latency seen: 1 s
    probe, *others = take(limit, 4)
    clock.now = 1.001
    for permit in others:  # refused, and back before the probe's 429: nothing served meanwhile
        limit.release(permit, OVERLOAD)  # three samples of 0 calls in transit
    for permit in permits:  # two calls served while the probe was out
        limit.release(permit, OK)
    limit.release(probe, OVERLOAD)  # 2 calls: the running mean 0.2 x 2 = 0.4, one call
    assert limit._margin() == 1  # counting the refused too: 0, 1, 2 and 5, a mean of 1.45


def test_a_probe_unrefused_for_a_few_round_trips_returns_to_the_plateau_in_doubling_steps() -> None:
    clock = Clock()
    limit, permits = admitted_probe(clock)
    assert limit.limit == 7  # the first step: one call; then 2, 4... 4 round trips apart
    for at, expected in ((3.135, 7), (3.136, 9), (3.171, 9), (3.172, 12)):
        clock.now = at
        limit.release(permits.pop(0), OK)
        refill(limit, permits)
        assert limit.limit == expected, at
    clock.now = 3.2
    limit.release(permits.pop(0), OK)  # 13: again up to a call over the level reached
    permits += take(limit, 2)  # levels 12 and 13
    top = permits.pop()  # level 13
    clock.now = 4.1
    limit.release(top, OK)  # served at 13: 2 x 13 is past the plateau, 20; 13 + 1 first
    assert limit.limit == 14
    for at, expected in ((4.136, 16), (4.172, 20)):
        clock.now = at
        limit.release(permits.pop(0), OK)
        refill(limit, permits)
        assert limit.limit == expected, at
    for end in range(10):  # back at the plateau: a hold (4 rounds of 20 successes) before growth
        clock.now = 4.2 + 0.1 * end
        limit.release(permits.pop(0), OK)
        refill(limit, permits)
    assert limit.limit == 20


def test_a_refused_step_of_the_return_ends_it() -> None:
    clock = Clock()
    limit, permits = admitted_probe(clock)
    assert limit.limit == 7
    permits += take(limit, limit.spare())
    clock.now = 3.105  # the step was refused: the service did not grow after all
    limit.release(permits.pop(), OVERLOAD)
    assert limit.limit == 6
    for at in (3.12, 3.3, 3.6):  # no more steps back, and the next probe waits a latency
        clock.now = at
        limit.release(permits.pop(0), OK)
        refill(limit, permits)
        assert limit.limit == 6, at


def test_a_refused_probe_is_not_taken_for_admitted() -> None:
    clock = Clock()
    limit = shrunk(clock)
    permits = take(limit, 4)
    clock.now = 2.0
    limit.release(permits.pop(0), OK)  # limit 5
    permits.append(limit.acquire())
    probe = limit.acquire()  # level 5 = the refused level + the margin: a probe
    clock.now = 2.005
    limit.release(probe, OVERLOAD)
    clock.now = 2.2  # long after: the probe's refusal came back, nothing to take for admitted
    limit.release(permits.pop(0), OK)
    assert limit.limit == 4


def test_a_served_try_does_not_count_the_refused_tries_in_flight_with_it() -> None:
    clock = Clock()
    limit = shrunk(clock)
    permits = take(limit, 4)
    clock.now = 2.0
    limit.release(permits.pop(0), OK)  # limit 5
    permits.append(limit.acquire())
    refused_first = limit.acquire()  # level 5
    clock.now = 2.2
    limit.release(permits.pop(0), OK)  # limit 6
    permits.append(limit.acquire())
    refused_later = limit.acquire()  # level 6
    clock.now = 2.201
    limit.release(refused_first, OVERLOAD)  # a cut to the 5 in flight; refused level 5
    clock.now = 2.21
    limit.release(permits.pop(0), OK)
    served = limit.acquire()  # level 5 counting `refused_later`, sent after the cut
    clock.now = 2.215
    limit.release(refused_later, OVERLOAD)  # sent before the cut: limit 4, the calls in flight
    clock.now = 2.8
    # The service held 4 with `served`, not 5: it has not grown, the limit stays (no growth
    # either, within a latency of the refusal).
    limit.release(served, OK)
    assert limit.limit == 4


def test_retry_after_holds_growth_until_it_has_passed() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=4, hold_rounds=0, clock=clock)
    permits = take(limit, 4)
    limit.release(permits.pop(), OVERLOAD, retry_after_s=5.0)  # limit 3, no growth before t=5
    for at in (1.0, 2.0, 3.0, 4.0):
        clock.now = at
        limit.release(permits.pop(0), OK)
        permits.append(limit.acquire())
    assert limit.limit == 3
    for at in (6.0, 7.0):
        clock.now = at
        limit.release(permits.pop(0), OK)
        permits.append(limit.acquire())
    assert limit.limit == 3  # two successes at 1/3 each
    clock.now = 8.0
    limit.release(permits.pop(0), OK)
    assert limit.limit == 4


def test_latency_rising_past_the_tolerance_cuts_by_the_ratio_at_most_by_half() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=32, maximum=32, latency_tolerance=1.5, clock=clock)

    def round_at(latency: float) -> None:
        permits = take(limit, limit.limit)
        clock.now += latency
        for permit in permits:
            limit.release(permit, OK)

    round_at(1.0)  # baseline: 1 s (a round: 32 calls)
    assert limit.limit == 32
    round_at(1.25)  # within the tolerance
    assert limit.limit == 32
    round_at(1.75)  # queueing: 32 x 1 / 1.75 = 18.3
    assert limit.limit == 18
    round_at(4.0)
    round_at(4.0)  # the round's 32 latencies end 14 calls into this one: 18 x 1/4, at most halved
    assert limit.limit == 9


def simulate(schedule: list[tuple[float, int]], until: float, latency: float = 1.0, lag: float = 0.0,
             jitter: float = 0.0, seed: int = 7) -> dict:
    """A service refusing past its limit (which follows `schedule`) in 3 ms, answering calls in
    `latency` +-10 %, fed by a caller with unlimited work; returns what happened (`done`: when
    the caller got each answer, `refused_at`: when the service refused each call).

    `lag` is each way between the caller and the service (+-`jitter` of it, drawn per trip): a
    call acquired at t reaches the service, which admits or refuses it against the calls it
    holds, at t + lag; a call the service ends at t frees its place there at t but is released
    by the caller at t + lag. So the caller's count of calls in flight includes those on their
    way, as a real client's does."""
    import random

    rng, trips = random.Random(seed), random.Random(seed + 4)
    clock = Clock()
    limit = AdaptiveLimit(clock=clock)
    # (at, call, what, permit, served): a call "arrive"s at the service, which later frees its
    # place ("free") and answers the caller ("answer"), both at once without lag ("free+answer").
    events: list[tuple[float, int, str, Permit, bool]] = []
    state = {"serving": 0, "calls": 0, "refused": 0, "done": [], "refused_at": []}

    def service_limit(t: float) -> int:
        return [lim for at, lim in schedule if t >= at][-1]

    def trip() -> float:
        return lag * trips.uniform(1 - jitter, 1 + jitter) if jitter else lag

    def arrive(t: float, call: int, permit: Permit) -> None:
        if state["serving"] >= service_limit(t):
            state["refused"] += 1
            state["refused_at"].append(t)
            heapq.heappush(events, (t + 0.003 + trip(), call, "answer", permit, False))
            return
        state["serving"] += 1
        end, back = t + latency * rng.uniform(0.9, 1.1), trip()
        if back:
            heapq.heappush(events, (end, call, "free", permit, True))
            heapq.heappush(events, (end + back, call, "answer", permit, True))
        else:
            heapq.heappush(events, (end, call, "free+answer", permit, True))

    def send(t: float) -> None:
        while limit.spare():
            permit = limit.acquire()
            state["calls"] += 1
            there = t + trip()
            if there == t:
                arrive(t, state["calls"], permit)
            else:
                heapq.heappush(events, (there, state["calls"], "arrive", permit, False))

    send(0.0)
    while events and events[0][0] < until:
        t, call, what, permit, ok = heapq.heappop(events)
        clock.now = t
        if what == "arrive":
            arrive(t, call, permit)
            continue
        if what != "answer":
            state["serving"] -= 1
        if what == "free":
            continue
        if ok:
            state["done"].append(t)
        limit.release(permit, OK if ok else OVERLOAD)
        send(t)
    return {**state, "limit": limit}


def completions(done: list[float], start: float, end: float) -> int:
    return sum(start <= t < end for t in done)


def test_against_a_service_whose_limit_halves_and_comes_back() -> None:
    run = simulate([(0, 64), (20, 32), (40, 64)], until=60)
    # Each phase's last 10 latencies: at least 90 % of what the limit in force allows
    # (limit / latency calls per second; latency 1 s on average).
    for end, service_limit in ((20, 64), (40, 32), (60, 64)):
        assert completions(run["done"], end - 10, end) >= 0.9 * service_limit * 10
    # Never far above the service's limit, and refusals a small share of the calls.
    assert run["limit"].limit <= 64 + 1
    assert run["refused"] / run["calls"] <= 0.02, run["refused"]


@pytest.mark.parametrize("lag", [0.0, 0.005, 0.02, 0.04])
@pytest.mark.parametrize("service_limit", [5, 200])
def test_finds_limits_far_from_where_it_starts(service_limit: int, lag: float) -> None:
    run = simulate([(0, service_limit)], until=30, lag=lag, jitter=0.5)
    # The calls on their way there and back (2 x lag x limit / latency of them, rounded up to
    # whole calls) count in flight here but not at the service: a limit that keeps it full is
    # that much above its own.
    in_transit = math.ceil(2 * lag * service_limit)
    assert service_limit - 1 <= run["limit"].limit <= service_limit + 1 + in_transit
    assert completions(run["done"], 20, 30) >= 0.9 * service_limit * 10


def limits_between(run: dict, start: float, end: float) -> list[int]:
    """The limits in force from `start` to `end`: the one set before it, then every change."""
    changes = run["limit"].changes
    before = [limit for at, limit, _ in changes if at < start]
    return [int(limit) for limit in before[-1:] + [limit for at, limit, _ in changes if start <= at < end]]


def refusals(run: dict, start: float, end: float) -> list[float]:
    return [t for t in run["refused_at"] if start <= t < end]


def assert_follows(run: dict, start: float, end: float, service_limit: int, lag: float) -> None:
    """A phase of a run against a lagged service (calls of 1 s on average) with `service_limit`
    from `start` to `end`, settled 5 latencies after a change (10 after the start)."""
    # A call holds its permit for the trip there and back too, so a limit equal to the
    # service's completes service_limit / (1 s + 2 lag) calls a second; one above it costs a
    # 429 on every few calls. At least 95 % of that over the phase's last 10 latencies.
    assert completions(run["done"], end - 10, end) >= 0.95 * service_limit * 10 / (1.0 + 2 * lag)
    settled = start + (10 if start == 0 else 5)
    limits = limits_between(run, settled, end)
    # Never more than two calls over the service's limit and the calls on their way there and
    # back (2 x lag x limit / latency), and no halving while the service stays where it is.
    assert max(limits) <= service_limit + 2 + 2 * lag * service_limit, limits
    assert min(limits) >= 0.8 * service_limit, limits
    # No burst of 429s in any second: a probe's few (the tries sent at each step before the
    # first 429 is back), not the tens of a return to a plateau the service does not hold.
    refused = refusals(run, settled, end)
    assert max((sum(t <= u < t + 1 for u in refused) for t in refused), default=0) <= 5, refused


# Lag each way, and its spread: a few ms to 20 ms against calls of ~1 s, so at 64 calls in
# flight 0.6 to 2.6 of them are on their way at any time.
LAGS = [(0.005, 0.5), (0.01, 0.5), (0.02, 0.5), (0.02, 0.0)]


@pytest.mark.parametrize(("lag", "jitter"), LAGS)
def test_against_a_lagged_service_whose_limit_halves_and_comes_back(lag: float, jitter: float) -> None:
    run = simulate([(0, 64), (20, 32), (40, 64)], until=60, lag=lag, jitter=jitter)
    for start, end, service_limit in ((0, 20, 64), (20, 40, 32), (40, 60, 64)):
        assert_follows(run, start, end, service_limit, lag)
    # While the service holds 64 steadily, at most 1 % of the calls are refused (probes).
    for start, end in ((10, 20), (45, 60)):
        refused = len(refusals(run, start, end))
        assert refused <= 0.01 * (completions(run["done"], start, end) + refused), refused


@pytest.mark.parametrize("lag", [0.005, 0.02])
@pytest.mark.parametrize("service_limit", [32, 64, 200])
def test_against_a_steady_lagged_service(service_limit: int, lag: float) -> None:
    run = simulate([(0, service_limit)], until=30, lag=lag, jitter=0.5)
    assert_follows(run, 0, 30, service_limit, lag)
    # At most one probing 429 every two latencies once settled: under 1 % of the calls from 64
    # calls in flight up.
    assert len(refusals(run, 10, 30)) <= 20 / 2, refusals(run, 10, 30)
