"""Shared channels (ovsim.engine.channel): the closed-form one-channel rate against the general
progressive-filling solver, which it must reproduce."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ovsim.engine.channel import max_min_rates, one_channel_rate

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
