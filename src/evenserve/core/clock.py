"""Injected clocks: policies never read the wall clock; drivers hand them `now`."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A monotonic source of seconds."""

    def now(self) -> float: ...


class RealClock:
    """Monotonic wall clock (seconds since an arbitrary origin)."""

    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to: for tests and for the simulator's drivers."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now(self) -> float:
        return self._now_s

    def advance(self, dt_s: float) -> None:
        if dt_s < 0:
            raise ValueError(f"cannot move a clock backwards (dt_s={dt_s})")
        self._now_s += dt_s

    def set(self, t_s: float) -> None:
        if t_s < self._now_s:
            raise ValueError(f"cannot move a clock backwards ({t_s} < {self._now_s})")
        self._now_s = t_s
