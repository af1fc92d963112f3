"""queue-aware: the articles' weighted score of queue depth, utilization and memory.

Formula (lower is better), over the hosting backends::

    score(b) = w_q * q(b) / max(q) + w_u * util(b) + w_m * (1 - free(b) / total(b))

where q(b) is the framework's queue estimate (mean of the last ``window`` sampled queue
depths plus this router's sends since the newest sample). Unknown utilization or memory
count as the worst value (1.0), never as idle.

Soft overload steers, it never refuses: a backend with ``q > overload_queue`` or (``util >
overload_util`` and ``free < overload_free_gb``) is skipped while any backend is not
overloaded. (Whether the front door refuses is ``routing.refusal``'s rule, not this one.)
Ties rotate, so equally idle backends share a burst.

Params (defaults are the articles'): ``queue_weight`` 0.5, ``utilization_weight`` 0.3,
``memory_weight`` 0.2, ``overload_queue`` 5, ``overload_utilization`` 0.85,
``overload_free_gb`` 2.0.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from evenserve.core.types import BackendView, RequestInfo
from evenserve.policy.registry import PolicyParams
from evenserve.policy.routing.base import ROUTING, rotating_argmin

GB = 1024.0**3


class QueueAwareParams(PolicyParams):
    queue_weight: float = Field(default=0.5, ge=0)
    utilization_weight: float = Field(default=0.3, ge=0)
    memory_weight: float = Field(default=0.2, ge=0)
    overload_queue: float = Field(default=5.0, ge=0)
    overload_utilization: float = Field(default=0.85, ge=0, le=1)
    overload_free_gb: float = Field(default=2.0, ge=0)


def memory_used_fraction(b: BackendView) -> float:
    if b.memory_total_bytes is None or b.memory_free_bytes is None or b.memory_total_bytes <= 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - b.memory_free_bytes / b.memory_total_bytes))


@ROUTING.register("queue-aware", QueueAwareParams, "articles' weighted queue/util/memory score")
class QueueAware:
    def __init__(self, params: QueueAwareParams) -> None:
        self.params = params
        self._tick = 0

    def overloaded(self, b: BackendView) -> bool:
        p = self.params
        if b.queue_depth > p.overload_queue:
            return True
        util = b.utilization
        free = b.memory_free_bytes
        return (
            util is not None
            and util > p.overload_utilization
            and free is not None
            and free < p.overload_free_gb * GB
        )

    def scores(self, backends: Sequence[BackendView]) -> list[float]:
        """Each backend's score in [0, w_q + w_u + w_m]."""
        p = self.params
        wq, wu, wm = p.queue_weight, p.utilization_weight, p.memory_weight
        qmax = max(b.queue_depth for b in backends)
        out = []
        for b in backends:
            qn = b.queue_depth / qmax if qmax > 0 else 0.0
            u = b.utilization
            util = 1.0 if u is None else (0.0 if u < 0.0 else (1.0 if u > 1.0 else u))
            out.append(wq * qn + wu * util + wm * memory_used_fraction(b))
        return out

    def choose(
        self, request: RequestInfo, backends: Sequence[BackendView], now_s: float
    ) -> BackendView:
        # One pass for the overload filter; scoring only the candidates that remain. Kept
        # allocation-light: the simulator calls this once per request.
        self._tick += 1
        overloaded = self.overloaded
        candidates = [b for b in backends if not overloaded(b)] or backends
        return candidates[rotating_argmin(self.scores(candidates), self._tick)]
