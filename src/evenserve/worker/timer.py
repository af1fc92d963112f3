"""Timers on an injected clock: the live driver uses the asyncio loop, tests a FakeTimer.

The batcher driver never sleeps; it asks a Timer to call it back at ``t_s`` on its clock.
RealTimer maps that onto ``loop.call_later``; FakeTimer keeps a heap and fires callbacks only
when a test (or a replay) advances the FakeClock, so a whole run is deterministic and
instantaneous.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable
from typing import Protocol

from evenserve.core.clock import Clock, FakeClock


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timer(Protocol):
    def call_at(self, t_s: float, callback: Callable[[], None]) -> TimerHandle: ...


class RealTimer:
    """Callbacks on the running asyncio loop, at times on ``clock``."""

    def __init__(self, clock: Clock, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.clock = clock
        self._loop = loop

    def call_at(self, t_s: float, callback: Callable[[], None]) -> TimerHandle:
        loop = self._loop or asyncio.get_running_loop()
        return loop.call_later(max(0.0, t_s - self.clock.now()), callback)


class _FakeHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTimer:
    """A timer heap on a FakeClock; ``advance_to`` fires due callbacks in (time, order) order."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, _FakeHandle, Callable[[], None]]] = []
        self._seq = itertools.count()

    def call_at(self, t_s: float, callback: Callable[[], None]) -> TimerHandle:
        h = _FakeHandle()
        heapq.heappush(self._heap, (max(t_s, self.clock.now()), next(self._seq), h, callback))
        return h

    def next_time(self) -> float:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else math.inf

    def advance_to(self, t_s: float) -> None:
        """Move the clock to ``t_s``, firing every callback due on the way, in time order."""
        while True:
            nxt = self.next_time()
            if nxt > t_s:
                break
            when, _, _handle, cb = heapq.heappop(self._heap)
            self.clock.set(max(when, self.clock.now()))
            cb()
        self.clock.set(max(t_s, self.clock.now()))

    def run_until_idle(self, limit_s: float = math.inf) -> None:
        """Fire callbacks until none is left (or the next one is after ``limit_s``)."""
        while True:
            nxt = self.next_time()
            if nxt == math.inf or nxt > limit_s:
                return
            self.advance_to(nxt)
