"""least-expected-work: the backend where this request is predicted to finish soonest.

Formula: pick argmin_b finish(b) + penalty(b), ties rotating, where finish(b) is
``work.predicted_finish_s`` (seconds until the request would be answered):

- with a latency profile for the request's model on b and fresh signals: the backlog the
  backend reported (its busy time, aged by the sample's age, plus its queued batches from
  the profiles, plus this router's sends since) and the request's own share of its batch;
- with a profile but stale or no signals: the same from this router's own in-flight counts
  per model (exact and current);
- without a profile: (requests in flight there + 1) x the seconds per request the router
  learned from that backend's own answers, so a slower device costs more without one.

penalty(b) is ``stale_penalty_ms`` when b's signals are stale (it may be failing), else 0.
A queued model without a profile or a learned figure costs ``fallback_item_ms`` per request.
Params: ``fallback_item_ms`` (10), ``stale_penalty_ms`` (50).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from evenserve.core.types import BackendView, RequestInfo
from evenserve.policy.registry import PolicyParams
from evenserve.policy.routing.base import ROUTING, rotating_argmin
from evenserve.policy.routing.work import optimistic_cost_s, predicted_finish_s


class LeastExpectedWorkParams(PolicyParams):
    fallback_item_ms: float = Field(default=10.0, ge=0)
    stale_penalty_ms: float = Field(default=50.0, ge=0)


@ROUTING.register("least-expected-work", LeastExpectedWorkParams, "soonest predicted finish")
class LeastExpectedWork:
    def __init__(self, params: LeastExpectedWorkParams) -> None:
        self.params = params
        self._tick = 0
        self._fallback_s = params.fallback_item_ms / 1000.0
        self._penalty_s = params.stale_penalty_ms / 1000.0

    def finish_s(self, request: RequestInfo, b: BackendView, now_s: float) -> float:
        finish = predicted_finish_s(request.model, b, now_s, self._fallback_s)
        return finish if b.signals_fresh else finish + self._penalty_s

    def choose(
        self, request: RequestInfo, backends: Sequence[BackendView], now_s: float
    ) -> BackendView:
        self._tick += 1
        fb = optimistic_cost_s(request.model, backends, self._fallback_s)
        pen = self._penalty_s
        keys = [
            predicted_finish_s(request.model, b, now_s, fb) + (0.0 if b.signals_fresh else pen)
            for b in backends
        ]
        return backends[rotating_argmin(keys, self._tick)]
