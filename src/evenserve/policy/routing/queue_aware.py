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

The Router decides through ``choose_indexed`` (the same answer, ``routing.finish_index``):
when no backend is overloaded, the best score is found by reading the backends in order of
predicted work and in order of their utilization and memory terms at once, computing each
one's exact score as it is first read, and stopping once a lower bound of any backend not
yet read is above the best (Fagin's threshold algorithm); ties rotate as in ``choose``.
With an overloaded backend it leaves the decision to ``choose``.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Sequence

from pydantic import Field

from evenserve.core.types import BackendView, RequestInfo
from evenserve.policy.registry import PolicyParams
from evenserve.policy.routing.base import ROUTING, rotating_argmin
from evenserve.policy.routing.finish_index import FinishIndex
from evenserve.policy.routing.work import optimistic_cost_s, predicted_finish_s

GB = 1024.0**3


class QueueAwareParams(PolicyParams):
    queue_weight: float = Field(default=0.5, ge=0)
    utilization_weight: float = Field(default=0.3, ge=0)
    memory_weight: float = Field(default=0.2, ge=0)
    overload_utilization: float = Field(default=0.85, ge=0, le=1)
    overload_free_gb: float = Field(default=2.0, ge=0)
    fallback_item_ms: float = Field(default=10.0, ge=0)


def utilization_term(b: BackendView) -> float:
    """The score's utilization: unknown counts as 1.0, clamped to [0, 1]."""
    u = b.utilization
    return 1.0 if u is None else (0.0 if u < 0.0 else (1.0 if u > 1.0 else u))


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
            out.append(wq * qn + wu * utilization_term(b) + wm * memory_used_fraction(b))
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

    def choose_indexed(
        self, request: RequestInfo, ix: FinishIndex, now_s: float
    ) -> BackendView | None:
        """``choose`` over ``ix``'s candidates, from the index (see the module's last
        paragraph); None (nothing done) when it cannot answer: an overloaded backend, or
        no work anywhere."""
        if not ix.refresh(now_s):
            return None
        st = ix.owner_state
        if ix.owner is not self or ix.sig_dirty or not isinstance(st, _ScoreIndex):
            st = self._score_index(ix)
        if st.over:
            return None
        views = ix.views
        n = len(views)
        finish = ix.finish
        keys, at = ix.keys, ix.at
        # Every backend's predicted work: the settled finish, exact for the busy ones.
        wmax = keys[-1] if keys else -math.inf
        work: dict[int, float] | None = None
        by_work: list[tuple[float, int]] = []
        if ix.busy or ix.stale:
            work = {}
            for p in ix.busy:
                w = predicted_finish_s(request.model, views[p], now_s, self._fallback_s)
                if w != w:
                    return None
                work[p] = w
            for p in ix.stale:
                work[p] = finish[p]
            for w in work.values():
                if w > wmax:
                    wmax = w
            by_work = sorted([(w, p) for p, w in work.items()])
        if not wmax > 0.0 or (st.slo_min is not None and wmax > st.slo_min):
            return None  # no work anywhere, or some backend may be past its SLO
        wq = self.params.queue_weight
        eps = st.eps
        u_term, m_term = st.u_term, st.m_term
        terms = st.order
        seen: set[int] = set()
        best = math.inf
        tied: list[int] = []
        n_keys, n_extra = len(keys), len(by_work)
        ki = bi = j = k = 0
        bucket: list[int] = []
        w_key = w_at = c_at = -math.inf
        while True:
            # Next by work: the settled order (by finish, then position) merged with the
            # exact ones.
            if bi >= len(bucket) and ki < n_keys:
                w_key = keys[ki]
                bucket = at[w_key]
                bi = 0
                ki += 1
            if bi < len(bucket) and (k >= n_extra or w_key <= by_work[k][0]):
                w_at = w_key
                p = bucket[bi]
                bi += 1
            elif k < n_extra:
                w_at, p = by_work[k]
                k += 1
            else:
                break
            if p not in seen:
                seen.add(p)
                # As ``_scores`` adds them: wq * qn + wu * util + wm * memory.
                sc = wq * (w_at / wmax) + u_term[p] + m_term[p]
                if sc < best:
                    best, tied = sc, [p]
                elif sc == best:
                    tied.append(p)
            if j < n:
                c_at, p = terms[j]
                j += 1
                if p not in seen:
                    seen.add(p)
                    w = work[p] if work is not None and p in work else finish[p]
                    sc = wq * (w / wmax) + u_term[p] + m_term[p]
                    if sc < best:
                        best, tied = sc, [p]
                    elif sc == best:
                        tied.append(p)
            # A backend not read yet has at least this much work and these terms.
            if wq * (w_at / wmax) + c_at - eps > best or len(seen) == n:
                break
        self._tick += 1
        if len(tied) == 1:
            return views[tied[0]]
        start = self._tick % n
        return views[min(tied, key=lambda q: (q < start, q))]

    def _score_index(self, ix: FinishIndex) -> _ScoreIndex:
        st = ix.owner_state
        if ix.owner is not self or not isinstance(st, _ScoreIndex):
            st = _ScoreIndex(len(ix.views), self.params)
            ix.owner, ix.owner_state = self, st
            ix.sig_dirty.update(range(len(ix.views)))
        if ix.sig_dirty:
            st.update(self, ix)
        return st


class _ScoreIndex:
    """Queue-aware's own figures per backend of a finish index, updated on load reports and
    staleness (``FinishIndex.sig_dirty``): the utilization and memory terms of the score
    (``wu * util``, ``wm * memory``, each as ``_scores`` computes it) and their sums in
    order, the backends overloaded by utilization and memory, and the least SLO reported."""

    __slots__ = ("entry", "eps", "m_term", "order", "over", "slo", "slo_min", "u_term")

    def __init__(self, n: int, params: QueueAwareParams) -> None:
        self.u_term = [0.0] * n
        self.m_term = [0.0] * n
        self.entry: list[tuple[float, int] | None] = [None] * n
        self.order: list[tuple[float, int]] = []
        self.over: set[int] = set()
        self.slo: list[float | None] = [None] * n
        self.slo_min: float | None = None
        #: What a bound may be off by in floating point, with room to spare: scores are
        #: sums of three terms in [0, weight].
        p = params
        self.eps = 1e-9 * (1.0 + p.queue_weight + p.utilization_weight + p.memory_weight)

    def update(self, policy: QueueAware, ix: FinishIndex) -> None:
        p_ = policy.params
        wu, wm = p_.utilization_weight, p_.memory_weight
        limit_u, limit_free = p_.overload_utilization, p_.overload_free_gb * GB
        model = ix.model
        order = self.order
        for p in ix.sig_dirty:
            b = ix.views[p]
            e = self.entry[p]
            if e is not None:
                del order[bisect_left(order, e)]
            u = self.u_term[p] = wu * utilization_term(b)
            m = self.m_term[p] = wm * memory_used_fraction(b)
            e = self.entry[p] = (u + m, p)
            insort(order, e)
            util, free = b.utilization, b.memory_free_bytes
            if util is not None and util > limit_u and free is not None and free < limit_free:
                self.over.add(p)
            else:
                self.over.discard(p)
            self.slo[p] = b.slo_s.get(model)
        ix.sig_dirty.clear()
        slos = [s for s in self.slo if s is not None]
        self.slo_min = min(slos) if slos else None
