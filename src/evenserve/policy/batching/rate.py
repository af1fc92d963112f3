"""A smoothed arrival-rate estimate, O(1) per arrival, shared by the adaptive policies.

An exponentially decaying event count: on each arrival the count decays by exp(-dt/tau) and
gains one; the rate is count / tau. It follows a step change in rate within a few tau and
decays toward zero when arrivals stop, without keeping any history.
"""

from __future__ import annotations

import math

#: Time constant of the per-queue arrival-rate estimates that the device choice reads (the
#: simulator's and the worker's queues alike), seconds.
QUEUE_RATE_TAU_S = 0.2


class RateEstimator:
    __slots__ = ("_count", "_last_s", "tau_s")

    def __init__(self, tau_s: float) -> None:
        if tau_s <= 0:
            raise ValueError("tau_s must be > 0")
        self.tau_s = tau_s
        self._count = 0.0
        self._last_s: float | None = None

    def observe(self, t_s: float) -> None:
        if self._last_s is not None:
            self._count *= math.exp(-max(0.0, t_s - self._last_s) / self.tau_s)
        self._count += 1.0
        self._last_s = t_s

    def rate_at(self, t_s: float) -> float:
        """Arrivals per second as of ``t_s``."""
        if self._last_s is None:
            return 0.0
        decay = math.exp(-max(0.0, t_s - self._last_s) / self.tau_s)
        return self._count * decay / self.tau_s
