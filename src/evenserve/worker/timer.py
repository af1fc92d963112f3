"""Timers on an injected clock: the live driver uses the asyncio loop.

The batcher driver never sleeps; it asks a Timer to call it back at ``t_s`` on its clock.
RealTimer maps that onto ``loop.call_later``; the tests' FakeTimer keeps a heap and fires
callbacks only when the test advances a FakeClock, so a whole run is deterministic and
instantaneous.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from evenserve.core.clock import Clock


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timer(Protocol):
    def call_at(self, t_s: float, callback: Callable[[], None]) -> TimerHandle: ...


class RealTimer:
    """Callbacks on the running asyncio loop, at times on ``clock``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def call_at(self, t_s: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(0.0, t_s - self.clock.now()), callback)
