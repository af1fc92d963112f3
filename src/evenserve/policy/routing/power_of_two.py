"""power-of-two: sample two hosting backends at random, keep the less loaded.

Formula: b1, b2 ~ uniform without replacement; pick argmin(queue_depth + in_flight), ties to
the fewer in-flight then to b1. With one host it is that host. Signals read: queue estimate and
the router's in-flight count. Params: ``choices`` (how many to sample, default 2).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from evenserve.core.types import BackendView, RequestInfo
from evenserve.policy.registry import PolicyParams
from evenserve.policy.routing.base import ROUTING


class PowerOfTwoParams(PolicyParams):
    choices: int = Field(default=2, ge=1)


@ROUTING.register("power-of-two", PowerOfTwoParams, "best of two random choices", seeded=True)
class PowerOfTwo:
    def __init__(self, params: PowerOfTwoParams, rng: random.Random) -> None:
        self.params = params
        self._rng = rng
        self._choices = params.choices

    def choose(
        self, request: RequestInfo, backends: Sequence[BackendView], now_s: float
    ) -> BackendView:
        n = len(backends)
        if n == 1:
            return backends[0]
        k = self._choices if self._choices < n else n
        if k == 2:  # the common case, without tuples (it is on the simulator's request path)
            # two_distinct(self._rng, n), inlined.
            bits = n.bit_length()
            getrandbits = self._rng.getrandbits
            i = getrandbits(bits)
            while i >= n:
                i = getrandbits(bits)
            if n <= 21:
                m = n - 1
                mbits = m.bit_length()
                j = getrandbits(mbits)
                while j >= m:
                    j = getrandbits(mbits)
                if j == i:
                    j = m
            else:
                j = i
                while j == i:
                    j = getrandbits(bits)
                    while j >= n:
                        j = getrandbits(bits)
            a, b = backends[i], backends[j]
            ka, kb = a.queue_depth + a.in_flight, b.queue_depth + b.in_flight
            return b if kb < ka or (kb == ka and b.in_flight < a.in_flight) else a
        picks = self._rng.sample(range(n), k)
        best = backends[picks[0]]
        best_key = (best.queue_depth + best.in_flight, best.in_flight)
        for i in picks[1:]:
            b = backends[i]
            key = (b.queue_depth + b.in_flight, b.in_flight)
            if key < best_key:
                best, best_key = b, key
        return best


def two_distinct(rng: random.Random, n: int) -> tuple[int, int]:
    """``tuple(rng.sample(range(n), 2))``: the same draws from the same stream, without the
    general function's cost (this is on the simulator's per-request path). ``sample`` draws
    from a shrinking pool for n <= 21 and redraws on a repeat above; each draw is CPython's
    ``_randbelow``: getrandbits(n.bit_length()) until below n."""
    bits = n.bit_length()
    getrandbits = rng.getrandbits
    i = getrandbits(bits)
    while i >= n:
        i = getrandbits(bits)
    if n <= 21:
        m = n - 1
        mbits = m.bit_length()
        j = getrandbits(mbits)
        while j >= m:
            j = getrandbits(mbits)
        return i, (m if j == i else j)
    j = i
    while j == i:
        j = getrandbits(bits)
        while j >= n:
            j = getrandbits(bits)
    return i, j
