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

The Router decides through ``choose_indexed`` (the same answer from an index kept per
model, ``routing.finish_index``); ``choose`` is the full pass over the candidates.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

from pydantic import Field

from evenserve.core.types import BackendView, RequestInfo
from evenserve.policy.registry import PolicyParams
from evenserve.policy.routing.base import ROUTING, rotating_argmin
from evenserve.policy.routing.finish_index import FinishIndex, rotate_ties
from evenserve.policy.routing.work import aged_busy_s, optimistic_cost_s, predicted_finish_s

#: A busy backend's exact finish (``predicted_finish_s``) and its settled one are the same
#: non-negative terms added in the same order, from its aged busy time and from 0.0: n
#: additions with a relative error of at most n * 2**-53 each way, so the exact figure is at
#: least (settled + aged busy time) * (1 - 2n * 2**-53), computed here with margin to spare
#: (a backend counts a few terms per model it hosts). Below that bound the exact figure is not
#: computed when it cannot tie or beat the best (``choose_indexed``).
BUSY_LOW = 1.0 - 1e-9


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

    def choose_indexed(
        self, request: RequestInfo, ix: FinishIndex, now_s: float
    ) -> BackendView | None:
        """``choose`` over ``ix``'s candidates, from the index: the least settled finish,
        exact finishes only for the busy backends whose settled (lower-bound) figure could
        tie or beat it, and the stale ones' settled finish plus the penalty; ties rotate as
        in ``choose``. None (nothing done) when the index cannot answer."""
        due = ix.busy_due
        if ix.dirty or ix.bad or now_s < ix.now_s or (due and due[0][0] <= now_s):
            if not ix.refresh(now_s):
                return None
        else:  # nothing to bring up to date (``refresh``'s checks, without the call)
            ix.now_s = now_s
        keys = ix.keys
        busy, stale = ix.busy_order, ix.stale_order
        if not busy and not stale:  # every backend settled: the order alone answers
            self._tick += 1
            tied = ix.at[keys[0]]
            if len(tied) == 1:
                return ix.views[tied[0]]
            i = bisect_left(tied, self._tick % len(ix.views))  # the first at or after start
            return ix.views[tied[i] if i < len(tied) else tied[0]]
        best = keys[0] if keys else math.inf
        extra: list[tuple[float, int]] = []
        views = ix.views
        # In order of their lower bounds, while one could tie or beat the best (the rest's
        # exact finishes are above it too); the exact finish only where the bound with the
        # aged busy time added could too (``BUSY_LOW``).
        for bound, p in busy:
            if bound > best:
                break
            b = views[p]
            if (bound + aged_busy_s(b, now_s)) * BUSY_LOW > best:
                continue
            k = predicted_finish_s(request.model, b, now_s, self._fallback_s)
            if k != k:
                return None  # NaN: the full pass decides
            extra.append((k, p))
            if k < best:
                best = k
        pen = self._penalty_s
        for f, p in stale:  # in order: f + pen only grows
            k = f + pen
            if k > best:
                break
            extra.append((k, p))
            if k < best:
                best = k
        self._tick += 1
        start = self._tick % len(views)
        ge, lo = ix.first_tied(best, start)
        return views[rotate_ties(ge, lo, extra, best, start)]
