"""A Poisson process whose rate is a base rate times piecewise-constant phase multipliers."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from evenserve.core.scenario import Phase


class PoissonProcess:
    """Arrival times of a Poisson process whose rate is ``base_rps`` times a phase multiplier.

    Exact for piecewise-constant rates: an exponential gap that would cross a phase boundary
    is redrawn from the boundary (memorylessness). Where phases overlap, the one listed last
    (by start time) applies. ``next_after(t)`` is all a driver needs: the simulator calls it
    once per arrival, so nothing is generated ahead of time.
    """

    def __init__(self, base_rps: float, phases: Sequence[Phase], rng: random.Random) -> None:
        self.base_rps = base_rps
        self.phases = sorted(phases, key=lambda p: p.start_s)
        self.rng = rng
        edges = {0.0}
        for p in self.phases:
            edges.add(p.start_s)
            edges.add(p.end_s)
        self._edges = sorted(edges)

    def rate_at(self, t_s: float) -> float:
        mult = 1.0
        for p in self.phases:
            if p.start_s <= t_s < p.end_s:
                mult = p.multiplier
        return self.base_rps * mult

    def _next_edge(self, t_s: float) -> float:
        for e in self._edges:
            if e > t_s:
                return e
        return math.inf

    def next_after(self, t_s: float) -> float:
        """The first arrival after ``t_s`` (``math.inf`` when the rate stays 0 for good)."""
        if not self.phases:  # a constant rate (the common case; the simulator's per-arrival path)
            return t_s + self.rng.expovariate(self.base_rps) if self.base_rps > 0 else math.inf
        while True:
            rate = self.rate_at(t_s)
            edge = self._next_edge(t_s)
            if rate <= 0:
                if edge == math.inf:
                    return math.inf
                t_s = edge
                continue
            nxt = t_s + self.rng.expovariate(rate)
            if nxt < edge or edge == math.inf:
                return nxt
            t_s = edge
