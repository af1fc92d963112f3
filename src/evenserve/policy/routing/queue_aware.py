"""queue-aware: the articles' weighted score of queue, utilization and memory, with the queue
measured in seconds of work.

Formula (lower is better), over the hosting backends::

    score(b) = w_q * W(b) / max(W) + w_u * util(b) + w_m * (1 - free(b) / total(b))

where W(b) is the predicted finish of this request on b in seconds (``work.predicted_finish_s``:
the queued work from the latency profiles, or from the router's learned seconds per request
when b has no profile). The articles counted requests; a count treats a device 2.5x slower
like the others, and 5 queued requests on a device that runs 8 in one batch like 5 batches.
Unknown utilization or memory count as the worst value (1.0), never as idle.

Soft overload steers, it never refuses: a backend where the request is predicted to finish
later than its model's SLO there (when the backend reports one), or with ``util >
overload_utilization`` and ``free < overload_free_gb``, is skipped while any backend is not
overloaded. (Whether the front door refuses is ``routing.refusal``'s rule, not this one.)
Ties rotate, so equally idle backends share a burst.

Params (weights and thresholds are the articles'): ``queue_weight`` 0.5,
``utilization_weight`` 0.3, ``memory_weight`` 0.2, ``overload_utilization`` 0.85,
``overload_free_gb`` 2.0; ``fallback_item_ms`` 10 (a request's cost where nothing better is
known, as in least-expected-work).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from evenserve.core.types import BackendView, RequestInfo
from evenserve.policy.registry import PolicyParams
from evenserve.policy.routing.base import ROUTING, rotating_argmin
from evenserve.policy.routing.work import optimistic_cost_s, predicted_finish_s

GB = 1024.0**3


class QueueAwareParams(PolicyParams):
    queue_weight: float = Field(default=0.5, ge=0)
    utilization_weight: float = Field(default=0.3, ge=0)
    memory_weight: float = Field(default=0.2, ge=0)
    overload_utilization: float = Field(default=0.85, ge=0, le=1)
    overload_free_gb: float = Field(default=2.0, ge=0)
    fallback_item_ms: float = Field(default=10.0, ge=0)


def memory_used_fraction(b: BackendView) -> float:
    if b.memory_total_bytes is None or b.memory_free_bytes is None or b.memory_total_bytes <= 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - b.memory_free_bytes / b.memory_total_bytes))


@ROUTING.register("queue-aware", QueueAwareParams, "articles' weighted queue/util/memory score")
class QueueAware:
    def __init__(self, params: QueueAwareParams) -> None:
        self.params = params
        self._tick = 0
        self._fallback_s = params.fallback_item_ms / 1000.0

    def overloaded(
        self, request: RequestInfo, b: BackendView, now_s: float, finish_s: float | None = None
    ) -> bool:
        """Soft overload of ``b`` for ``request`` (``finish_s``: its predicted finish there,
        when already computed)."""
        p = self.params
        slo = b.slo_s.get(request.model)
        if slo is not None:
            if finish_s is None:
                finish_s = predicted_finish_s(request.model, b, now_s, self._fallback_s)
            if finish_s > slo:
                return True
        util = b.utilization
        free = b.memory_free_bytes
        return (
            util is not None
            and util > p.overload_utilization
            and free is not None
            and free < p.overload_free_gb * GB
        )

    def scores(
        self, request: RequestInfo, backends: Sequence[BackendView], now_s: float
    ) -> list[float]:
        """Each backend's score in [0, w_q + w_u + w_m]."""
        fb = optimistic_cost_s(request.model, backends, self._fallback_s)
        work = [predicted_finish_s(request.model, b, now_s, fb) for b in backends]
        return self._scores(backends, work)

    def _scores(self, backends: Sequence[BackendView], work: Sequence[float]) -> list[float]:
        p = self.params
        wq, wu, wm = p.queue_weight, p.utilization_weight, p.memory_weight
        wmax = max(work)
        out = []
        for b, w in zip(backends, work, strict=True):
            qn = w / wmax if wmax > 0 else 0.0
            u = b.utilization
            util = 1.0 if u is None else (0.0 if u < 0.0 else (1.0 if u > 1.0 else u))
            out.append(wq * qn + wu * util + wm * memory_used_fraction(b))
        return out

    def choose(
        self, request: RequestInfo, backends: Sequence[BackendView], now_s: float
    ) -> BackendView:
        # One pass for the predicted work and the overload filter; scoring only the
        # candidates that remain. Kept allocation-light: the simulator calls this per request.
        self._tick += 1
        if len(backends) == 1:  # what the scoring below would pick, overloaded or not
            return backends[0]
        model = request.model
        fb = optimistic_cost_s(model, backends, self._fallback_s)
        work = [predicted_finish_s(model, b, now_s, fb) for b in backends]
        overloaded = self.overloaded
        keep = [i for i, b in enumerate(backends) if not overloaded(request, b, now_s, work[i])]
        if keep and len(keep) < len(backends):
            backends = [backends[i] for i in keep]
            work = [work[i] for i in keep]
        return backends[rotating_argmin(self._scores(backends, work), self._tick)]
