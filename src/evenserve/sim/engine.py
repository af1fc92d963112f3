"""A minimal discrete-event engine: a heap of (time, sequence, callback, argument).

Ties in time are broken by insertion order (the sequence number), so a run is a pure
function of its inputs and seed. A hot caller whose time is never before ``now`` may push
``(t, next(count), fn, arg)`` onto ``heap`` itself: what ``at`` does, without the call. A
caller may also hold events of its own off the heap, each with the number ``next(count)``
gave it when it was made, handle one itself while it comes before ``heap[0]`` by (time,
number), setting ``now``, and push the rest under their own time and number: the same
order (``Simulation._open_arrival_routed``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any


class EventLoop:
    __slots__ = ("count", "heap", "now")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self.count = itertools.count(1)
        self.now = 0.0

    def at(self, t_s: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        now = self.now
        heappush(self.heap, (now if t_s < now else t_s, next(self.count), fn, arg))

    def run(self, until_s: float) -> None:
        """Process events with time <= until_s in order; leave later ones in the heap."""
        heap = self.heap
        pop = heappop
        while heap:
            t, _, fn, arg = ev = pop(heap)
            if not t <= until_s:
                heappush(heap, ev)
                break
            self.now = t
            fn(arg)
        self.now = max(self.now, until_s)

    def __len__(self) -> int:
        return len(self.heap)
