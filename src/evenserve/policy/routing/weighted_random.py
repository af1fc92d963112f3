"""weighted-random: static weights, drawn with a seeded RNG.

Formula: P(b) = w_b / sum(w) over the hosting backends. Signals read: none.
Params: ``weights`` (backend name -> weight >= 0; backends not named get ``default_weight``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from evenserve.core.types import BackendView, RequestInfo
from evenserve.policy.registry import PolicyParams
from evenserve.policy.routing.base import ROUTING


class WeightedRandomParams(PolicyParams):
    weights: dict[str, float] = Field(default_factory=dict)
    default_weight: float = Field(default=1.0, ge=0)

    def model_post_init(self, __context: object) -> None:
        for name, w in self.weights.items():
            if w < 0:
                raise ValueError(f"weights.{name}: must be >= 0")


@ROUTING.register(
    "weighted-random", WeightedRandomParams, "static weights, seeded draw", seeded=True
)
class WeightedRandom:
    def __init__(self, params: WeightedRandomParams, rng: random.Random) -> None:
        self.params = params
        self._rng = rng

    def choose(
        self, request: RequestInfo, backends: Sequence[BackendView], now_s: float
    ) -> BackendView:
        ws = [self.params.weights.get(b.name, self.params.default_weight) for b in backends]
        total = sum(ws)
        if total <= 0:
            return backends[self._rng.randrange(len(backends))]
        x = self._rng.random() * total
        acc = 0.0
        for b, w in zip(backends, ws, strict=True):
            acc += w
            if x < acc:
                return b
        return backends[-1]
