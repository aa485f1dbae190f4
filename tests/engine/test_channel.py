"""Shared channels (ovsim.engine.channel): the closed-form one-channel rate against the general
progressive-filling solver, which it must reproduce."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovsim.engine.channel import latency_slowdowns, max_min_rates, one_channel_rate

rates = st.floats(min_value=0.0, max_value=4.0, allow_nan=False)
weights = st.floats(min_value=0.05, max_value=20.0, allow_nan=False)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(rates, weights), min_size=1, max_size=6), st.floats(min_value=0.1, max_value=3.0))
def test_one_channel_rate_is_the_general_solvers(flows: list[tuple[float, float]], capacity: float) -> None:
    caps = [c for c, _ in flows]
    ws = [w for _, w in flows]
    general = max_min_rates(caps, ws, [[(0, 1.0)]] * len(caps), [capacity]).rates[0]
    assert one_channel_rate(caps, ws, capacity) == pytest.approx(general, rel=1e-9, abs=1e-12)


def test_one_channel_rate_by_hand() -> None:
    # Fits: everyone at its cap.
    assert one_channel_rate([0.3, 0.5], [1.0, 1.0], 1.0) == 0.3
    # Equal weights, both above half: half each.
    assert one_channel_rate([0.8, 0.9], [1.0, 1.0], 1.0) == pytest.approx(0.5)
    # The other takes its small cap (0.2); the rest (0.8) is ours.
    assert one_channel_rate([0.9, 0.2], [1.0, 1.0], 1.0) == pytest.approx(0.8)
    # Weight 3 against 1: a quarter of the channel.
    assert one_channel_rate([1.0, 1.0], [1.0, 3.0], 1.0) == pytest.approx(0.25)
    assert one_channel_rate([0.0, 1.0], [1.0, 1.0], 0.5) == 0.0
    with pytest.raises(ValueError):
        one_channel_rate([1.0], [0.0], 1.0)


def test_a_subnormal_cap_does_not_starve_the_others() -> None:
    # The other activity's headroom over its weight underflows to zero: it is at its cap, and the
    # first takes the rest of the channel (the guard used to freeze the first at zero).
    alloc = max_min_rates([1.0, 5e-324], [1.0, 2.0], [[(0, 1.0)], [(0, 1.0)]], [0.5])
    assert alloc.rates[0] == pytest.approx(0.5)
    assert alloc.rates[1] == 5e-324


def test_latency_law_closed_form_for_two_equal_users() -> None:
    # Two users that wait on memory all the time, each moving x alone, with exponent 1: by symmetry
    # each moves U / 2, and U / 2 = x (1 - U / k) / (1 - x / k) gives U = 2x / (1 + x / k).
    x, k = 0.4, 2.0
    slow, u = latency_slowdowns([x, x], [1.0, 1.0], k, 1.0)
    u_closed = 2 * x / (1 + x / k)
    assert u == pytest.approx(u_closed, rel=1e-8)
    assert slow[0] == pytest.approx(slow[1], rel=1e-12)
    assert slow[0] == pytest.approx((1 - x / k) / (1 - u_closed / k), rel=1e-8)


def test_latency_law_leaves_users_that_do_not_wait_alone() -> None:
    # Nobody waits on memory: nobody slows, however much they move.
    assert latency_slowdowns([0.7, 0.6], [0.0, 0.0], 2.0, 4.0)[0] == [1.0, 1.0]
    # One user alone never slows.
    assert latency_slowdowns([0.9], [1.0], 2.0, 4.0)[0] == [1.0]
    # A user that does not wait still loads the memory: the one that does slows, it does not.
    slow, _ = latency_slowdowns([0.3, 0.6], [1.0, 0.0], 2.0, 4.0)
    assert slow[0] > 1.0 and slow[1] == 1.0


def test_latency_law_users_move_what_the_total_says() -> None:
    # U is the fixed point: what every user moves once slowed adds up to it.
    xs, ws = [0.57, 0.25, 0.1], [0.85, 0.4, 0.0]
    slow, u = latency_slowdowns(xs, ws, 2.5, 6.0)
    assert sum(x / s for x, s in zip(xs, slow, strict=True)) == pytest.approx(u, rel=1e-8)
    # The more a user waits on memory, the more it slows beside the same load.
    a, _ = latency_slowdowns([0.3, 0.3], [0.9, 0.1], 2.5, 6.0)
    assert a[0] > a[1] > 1.0
