"""Predicted work on a backend, in seconds: what least-expected-work minimises, what
queue-aware weighs as its queue term, and what the gateway's refusal rule compares with the SLO.

Formulas, per backend b and request model r, with t_m the profile's batch time of model m on
b, B_m its max batch size and ``work_m(q) = floor(q / B_m) * t_m(B_m) + t_m(q mod B_m)``
(``t_m(0) = 0``; a model without a profile costs ``q * c_m``, c_m the learned seconds per
request below, else the fallback per request):

- With a profile for r and fresh signals (the backend's own evidence, aged)::

      backlog(b) = max(0, busy_remaining(b) - age(b)) + sum_m work_m(q_m(b))
      finish(b)  = backlog(b) + work_r(q_r(b) + 1) - work_r(q_r(b))

  where q_m is the router's queue estimate (sampled mean plus own sends since, net of
  answers) and age(b) = now - when the newest sample was taken: a running batch that had
  20 ms left at a sample 15 ms ago has 5 ms left.
- With a profile for r but stale or no signals: the same sums over the router's own
  in-flight counts per model, k_m(b) (exact and current; they include the running batch,
  counted whole).
- Without a profile for r (a backend whose profile set the gateway does not have)::

      finish(b) = (max(in_flight(b), queue_depth(b)) + 1) * c_r(b)

  with c_r(b) the router's learned seconds of latency per request in flight at the send
  (``BackendView.latency_per_request_s``; the fallback per request until it has answers):
  a device 2.5x slower answers 2.5x later at the same count, so it learns a 2.5x cost.

``predicted_wait_s`` is the refusal rule's figure: only the backend's evidence (fresh signals
and a profile for every queued model, else None: no evidence, no refusal), and only the
work ahead of the request (its own batch's time and the partial batch it would join are not
counted), so it errs on the side of serving.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from evenserve.core.profile import LatencyProfile
from evenserve.core.types import BackendView


def queue_work_s(
    profile: LatencyProfile | None, queued: float, max_batch: int, item_s: float
) -> float:
    """Seconds to drain ``queued`` requests in full batches of ``max_batch`` (``item_s`` per
    request without a profile)."""
    q = round(queued)
    if q <= 0:
        return 0.0
    if profile is None:
        return q * item_s
    full_s, rest_s = profile.queue_parts_s(q, max_batch)
    return full_s + rest_s


def aged_busy_s(b: BackendView, now_s: float) -> float:
    at = b.sampled_at_s
    left = b.busy_remaining_s - (now_s - at if at is not None and now_s > at else 0.0)
    return left if left > 0.0 else 0.0


def optimistic_cost_s(model: str, backends: Sequence[BackendView], fallback_item_s: float) -> float:
    """The cost per request to assume for a backend that has not learned one yet: the least
    any candidate has learned for ``model``, else ``fallback_item_s``. Optimism: a backend
    not yet measured gets traffic and so a measurement; a pessimistic default would keep it
    from ever being measured (one fast backend would take everything)."""
    best = fallback_item_s
    seen = False
    for b in backends:
        c = b.latency_per_request_s.get(model)
        if c is not None and (not seen or c < best):
            best, seen = c, True
    return best


def predicted_finish_s(model: str, b: BackendView, now_s: float, fallback_item_s: float) -> float:
    """Seconds until a request of ``model`` sent to ``b`` now would be answered (see the
    module's formulas). On the simulator's per-request path: kept to dict reads and a few
    profile lookups."""
    prof = b.profiles.get(model)
    if prof is None:
        cost = b.latency_per_request_s.get(model, fallback_item_s)
        n = b.queue_depth if b.queue_depth > b.in_flight else float(b.in_flight)
        return (n + 1.0) * cost
    if b.signals_fresh:
        counts = b.queued_by_model
        backlog = backlog_s(b, counts, aged_busy_s(b, now_s), fallback_item_s)
    else:
        counts = b.in_flight_by_model
        backlog = backlog_s(b, counts, 0.0, fallback_item_s)
    return backlog + own_share_s(model, prof, b, counts)


def settled_finish_s(model: str, b: BackendView) -> float | None:
    """``predicted_finish_s`` of a backend with a profile for ``model`` once its sampled busy
    time has aged away (fresh signals), or with stale ones (then it is exact, and the same at
    any time): the same sums in the same order, from a backlog of 0.0. A lower bound of the
    finish while busy time remains (floating-point addition is monotone). None where the
    figure would take the fallback cost (no profile for ``model``, or a queued model
    without one), which depends on the other candidates: ``routing.finish_index`` then
    leaves the decision to the policy's full pass."""
    prof = b.profiles.get(model)
    if prof is None:
        return None
    counts = b.queued_by_model if b.signals_fresh else b.in_flight_by_model
    backlog = backlog_s(b, counts, 0.0, None)
    return None if backlog != backlog else backlog + own_share_s(model, prof, b, counts)


def backlog_s(
    b: BackendView, counts: Mapping[str, float], backlog: float, fallback_item_s: float | None
) -> float:
    """``backlog`` (the aged busy time) plus each counted model's queued work, added in
    ``counts``' order; NaN when a counted model has no profile and no ``fallback_item_s``
    is given (the figure would need it)."""
    profiles = b.profiles
    caps = b.max_batch_size
    for m, q in counts.items():
        if q >= 0.5:
            p = profiles.get(m)
            if p is None:
                if fallback_item_s is None:
                    return math.nan
                backlog += round(q) * b.latency_per_request_s.get(m, fallback_item_s)
            else:
                full_s, rest_s = p.queue_parts[round(q), caps.get(m, 1)]
                backlog += full_s
                backlog += rest_s
    return backlog


def own_share_s(
    model: str, prof: LatencyProfile, b: BackendView, counts: Mapping[str, float]
) -> float:
    """A request's own share of its batch: work_r(q + 1) - work_r(q) = t(rest + 1) - t(rest),
    rest = q mod B_r."""
    cap = b.max_batch_size.get(model, 1)
    return prof.own_share[round(counts.get(model, 0.0)) % (cap if cap > 1 else 1)]


def predicted_wait_s(
    model: str, b: BackendView, now_s: float, queued: Mapping[str, float] | None = None
) -> float | None:
    """Seconds of work ahead of a request of ``model`` sent to ``b`` now, on the backend's own
    evidence (``queued``: the queues to count, default the view's estimate); None when there
    is none (stale signals, or a queued model without a profile)."""
    if not b.signals_fresh or model not in b.profiles:
        return None
    wait = aged_busy_s(b, now_s)
    for m, q in (b.queued_by_model if queued is None else queued).items():
        if q <= 0:
            continue
        prof = b.profiles.get(m)
        if prof is None:
            return None
        cap = b.max_batch_size.get(m, 1)
        if m == model:  # the partial batch it would join runs with it: not ahead of it
            q = (round(q) // max(1, cap)) * max(1, cap)
        wait += queue_work_s(prof, q, cap, 0.0)
    return wait
