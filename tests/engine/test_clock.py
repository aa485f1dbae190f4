"""The engine's event queue: time order, ties in scheduling order, times as now + delay."""

from __future__ import annotations

import math

import pytest

from ovsim.engine.clock import EventQueue


def test_events_run_in_time_order_and_ties_in_the_order_scheduled() -> None:
    q = EventQueue()
    seen: list[tuple[float, object]] = []

    def note(value: object) -> None:
        seen.append((q.now, value))

    q.schedule(2.0, note, "late")
    q.schedule(1.0, note, "first at 1")
    q.schedule(1.0, note, "second at 1")
    q.schedule(0.0, note, "now")
    assert q.peek() == 0.0
    q.run()
    assert seen == [(0.0, "now"), (1.0, "first at 1"), (1.0, "second at 1"), (2.0, "late")]
    assert q.peek() == math.inf


def test_an_event_scheduled_from_a_callback_counts_from_its_time() -> None:
    q = EventQueue()
    seen: list[tuple[float, str]] = []

    def chain(value: object) -> None:
        seen.append((q.now, str(value)))
        if value == "a":
            q.schedule(0.5, chain, "b")
            # Due at the same time as one scheduled earlier from outside: runs after it.
            q.schedule(1.0, chain, "d")

    q.schedule(1.0, chain, "a")
    q.schedule(2.0, chain, "c")
    q.run()
    assert seen == [(1.0, "a"), (1.5, "b"), (2.0, "c"), (2.0, "d")]


def test_a_time_set_as_at_minus_now_lands_at_now_plus_that_delay() -> None:
    """The engine schedules a completion at ``at`` as delay ``at - now``; the event's time is
    ``now + (at - now)``, which can differ from ``at`` by an ulp, exactly as simpy's timeout."""
    q = EventQueue()
    times: list[float] = []
    q.schedule(0.1, lambda _: q.schedule(0.3 - q.now, lambda _: times.append(q.now)))
    q.run()
    assert times == [0.1 + (0.3 - 0.1)]


def test_a_negative_or_nan_delay_is_refused() -> None:
    q = EventQueue()
    with pytest.raises(ValueError, match="past"):
        q.schedule(-1e-9, lambda _: None)
    with pytest.raises(ValueError, match="past"):
        q.schedule(math.nan, lambda _: None)
