"""The engine's clock and event queue.

An event is a callback due at a time. Events run in time order, and those due at the same time in
the order they were scheduled: the order simpy's queue gives events of one priority, which is all
the engine used of simpy. Twenty lines replace that dependency, and with the engine compiled
(setup.py) the queue compiles with it (docs/design.md, "A compiled engine").
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from ovsim.engine.state import INF


class EventQueue:
    """Scheduled callbacks, run in (time, scheduling order)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[object], None], object]] = []
        self._seq = 0

    def schedule(self, delay_s: float, callback: Callable[[object], None], value: object = None) -> None:
        """Call ``callback(value)`` ``delay_s`` from now (at ``now + delay_s``, as simpy's timeout
        computes it, so that a time set as ``at - now`` lands where simpy's would)."""
        if not delay_s >= 0.0:
            raise ValueError(f"an event cannot be scheduled {delay_s} s in the past")
        heapq.heappush(self._heap, (self.now + delay_s, self._seq, callback, value))
        self._seq += 1

    def peek(self) -> float:
        """The time of the next event, or infinity when none is scheduled."""
        return self._heap[0][0] if self._heap else INF

    def run(self) -> None:
        """Run events until none is left; each may schedule more."""
        heap = self._heap
        while heap:
            at, _, callback, value = heapq.heappop(heap)
            self.now = at
            callback(value)
