"""Predicted work on a backend, in seconds: what the gateway's refusal rule compares with
the SLO.

With t_m the profile's batch time of model m on b, B_m its max batch size and
``work_m(q) = floor(q / B_m) * t_m(B_m) + t_m(q mod B_m)`` (``t_m(0) = 0``)::

    wait_r(b) = max(0, busy_remaining(b) - age(b)) + sum_{m != r} work_m(q_m(b))
                + work_r(B_r * floor(q_r(b) / B_r))

where age(b) = now - when the newest sample was taken (a running batch that had 20 ms left
at a sample 15 ms ago has 5 ms left). Only the backend's evidence counts (fresh signals and
a profile for every queued model, else None: no evidence, no refusal), and only the work
ahead of the request (its own batch's time and the partial batch it would join are not
counted), so it errs on the side of serving.
"""

from __future__ import annotations

from collections.abc import Mapping

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
    full, rest = divmod(q, max(1, max_batch))
    work = full * profile.latency_s(max_batch) if full else 0.0
    if rest:
        work += profile.latency_s(rest)
    return work


def _aged_busy_s(b: BackendView, now_s: float) -> float:
    at = b.sampled_at_s
    left = b.busy_remaining_s - (now_s - at if at is not None and now_s > at else 0.0)
    return left if left > 0.0 else 0.0


def predicted_wait_s(
    model: str, b: BackendView, now_s: float, queued: Mapping[str, float] | None = None
) -> float | None:
    """Seconds of work ahead of a request of ``model`` sent to ``b`` now, on the backend's own
    evidence (``queued``: the queues to count, default the view's estimate); None when there
    is none (stale signals, or a queued model without a profile)."""
    if not b.signals_fresh or model not in b.profiles:
        return None
    wait = _aged_busy_s(b, now_s)
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
