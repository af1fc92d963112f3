"""Closed-loop users: exponential think times and a model drawn from the mix at each arrival."""

from __future__ import annotations

import bisect
import random
from collections.abc import Mapping

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import ClosedLoop
from evenserve.workload.mix import check_mix
from evenserve.workload.seeding import workload_rng


class ClosedLoopUsers:
    """Think times and mix draws of closed-loop users, on one seeded generator.

    A user thinks (``think_s``), sends one request whose model is ``draw_model``, waits for
    its answer (or refusal), and thinks again. The draws happen in the order the driver asks
    for them, so the driver fixes the sequence: the simulator asks one object for all its
    users in event order (think when a user starts thinking, the model when its request
    arrives); the live load generator gives each user an object of its own.

    The mix's cumulative weights are built in sorted model order, each weight over the total
    of all weights, zero weights left out and the last bound set to exactly 1.0; a draw is the
    first model whose bound is at least ``rng.random()``.
    """

    __slots__ = ("cum_weights", "mean_think_s", "models", "rng")

    def __init__(self, mix: Mapping[str, float], mean_think_s: float, rng: random.Random) -> None:
        if not mean_think_s >= 0:
            raise ConfigError(f"think time: must be >= 0 seconds, got {mean_think_s!r}")
        total = check_mix(mix)
        self.models: list[str] = []
        self.cum_weights: list[float] = []
        acc = 0.0
        for m in sorted(mix):
            if mix[m] > 0:
                acc += mix[m] / total
                self.models.append(m)
                self.cum_weights.append(acc)
        self.cum_weights[-1] = 1.0
        self.mean_think_s = mean_think_s
        self.rng = rng

    @classmethod
    def for_workload(cls, wl: ClosedLoop, seed: int) -> ClosedLoopUsers:
        """A scenario's users as the simulator runs them: ``{seed}:workload``, think_ms / 1000."""
        return cls(wl.mix, wl.think_ms / 1000.0, workload_rng(seed))

    def think_s(self) -> float:
        """An exponential think time with the mean (0 when the mean is 0: no draw)."""
        mean = self.mean_think_s
        return self.rng.expovariate(1.0 / mean) if mean > 0 else 0.0

    def draw_model(self) -> str:
        return self.models[bisect.bisect_left(self.cum_weights, self.rng.random())]
