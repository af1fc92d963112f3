"""A minimal discrete-event engine: a heap of (time, sequence, callback, argument).

Ties in time are broken by insertion order (the sequence number), so a run is a pure
function of its inputs and seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    __slots__ = ("_heap", "_seq", "now")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self.now = 0.0

    def at(self, t_s: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        if t_s < self.now:
            t_s = self.now
        self._seq += 1
        heapq.heappush(self._heap, (t_s, self._seq, fn, arg))

    def run(self, until_s: float) -> None:
        """Process events with time <= until_s in order; leave later ones in the heap."""
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= until_s:
            t, _, fn, arg = pop(heap)
            self.now = t
            fn(arg)
        self.now = max(self.now, until_s)

    def __len__(self) -> int:
        return len(self._heap)
