"""least-expected-work: the backend where this request is predicted to finish soonest.

Formula, per hosting backend b, from its latency profiles::

    backlog(b) = busy_remaining(b) + sum_m work_m(q_m(b))
    work_m(q)  = floor(q / B_m) * t_m(B_m) + t_m(q mod B_m)    (t_m(0) = 0)
    finish(b)  = backlog(b) + work_r(q_r(b) + 1) - work_r(q_r(b))

where q_m is the queued count of model m, B_m its max batch size and t_m the profile's batch
time; r is the request's model. Pick argmin finish(b); ties rotate. A backend without a
profile for a queued model falls back to ``fallback_item_ms`` per request. Stale backends are
penalised by ``stale_penalty_ms``.
Params: ``fallback_item_ms`` (10), ``stale_penalty_ms`` (50).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from evenserve.core.types import BackendView, RequestInfo
from evenserve.policy.registry import PolicyParams
from evenserve.policy.routing.base import ROUTING, rotating_argmin
from evenserve.policy.routing.work import queue_work_s


class LeastExpectedWorkParams(PolicyParams):
    fallback_item_ms: float = Field(default=10.0, ge=0)
    stale_penalty_ms: float = Field(default=50.0, ge=0)


@ROUTING.register("least-expected-work", LeastExpectedWorkParams, "soonest predicted finish")
class LeastExpectedWork:
    def __init__(self, params: LeastExpectedWorkParams) -> None:
        self.params = params
        self._tick = 0

    def finish_s(self, request: RequestInfo, b: BackendView) -> float:
        fb = self.params.fallback_item_ms / 1000.0
        backlog = b.busy_remaining_s
        for m, q in b.queued_by_model.items():
            backlog += queue_work_s(b.profiles.get(m), q, b.max_batch_size.get(m, 1), fb)
        r = request.model
        prof = b.profiles.get(r)
        mb = b.max_batch_size.get(r, 1)
        qr = b.queued_by_model.get(r, 0.0)
        own = queue_work_s(prof, qr + 1, mb, fb) - queue_work_s(prof, qr, mb, fb)
        penalty = 0.0 if b.signals_fresh else self.params.stale_penalty_ms / 1000.0
        return backlog + own + penalty

    def choose(
        self, request: RequestInfo, backends: Sequence[BackendView], now_s: float
    ) -> BackendView:
        self._tick += 1
        keys = [self.finish_s(request, b) for b in backends]
        return backends[rotating_argmin(keys, self._tick)]
