"""Which model's batch a free device runs next: shared by the simulator and the live worker.

A device is shared by the models placed on it and runs one batch at a time (per instance).
When an instance is free, each hosted model's batching policy is asked about its own queue.
Among the models whose policy says Dispatch, the one whose oldest waiting request has the
highest priority, then the earliest arrival, goes first (FIFO across models within a class).
If none is ready, the answer is the earliest time any policy asked to be woken.

Classes. Offline work fills the valleys online work leaves:
- a lower-class batch never delays a higher class that is only waiting for its batching
  window: it runs only if the profile says it ends before that window's wake-up time;
- with ``class_headroom`` set, a lower-class batch runs only while the higher classes'
  demand on the device, sum of rate x per-request time at their max batch size (from each
  queue's smoothed arrival rate and profile, empty queues included), is at most that
  fraction of the device. In an online burst offline work pauses instead of taking every
  other batch slot.
With ``starvation_s`` set, a queue whose head has waited longer than that competes as the
highest class (bounded starvation). With ``rate_tau_s`` (the time constant of the rate
estimates) a batch held back by the headroom comes with a wake-up time: when, without new
arrivals, the higher classes' demand will have decayed to the headroom (rates decay as
exp(-dt/tau)), so held-back work never waits for an arrival that may not come.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from evenserve.core.types import Dispatch, QueueView
from evenserve.policy.batching.base import BatchingPolicy


@dataclass(slots=True)
class NextBatch:
    """Run ``n`` requests of ``model`` now (``model`` is None when nothing is ready). Not
    frozen: one is made per decision of a device with several models, and a frozen
    dataclass sets each field through ``object.__setattr__``."""

    model: str | None
    n: int
    wake_s: float = math.inf


def next_batch(
    queues: Iterable[tuple[QueueView, BatchingPolicy]],
    now_s: float,
    *,
    starvation_s: float | None = None,
    class_headroom: float | None = None,
    rate_tau_s: float | None = None,
) -> NextBatch:
    best: tuple[float, float] | None = None
    best_view: QueueView | None = None
    best_n = 0
    wake = math.inf
    waiting: list[tuple[float, float]] = []
    demand: list[tuple[float, float]] = []
    for view, policy in queues:
        if class_headroom is not None and view.arrival_rate_rps and view.profile is not None:
            cls = view.default_priority
            if cls is None and view.requests:
                cls = view.requests[0].priority
            if cls is not None:
                b = max(1, policy.max_batch_size)
                demand.append((float(cls), view.arrival_rate_rps * view.profile.per_item_s(b)))
        if not view.requests:
            continue
        head = view.requests[0]
        prio = float(head.priority)
        if starvation_s is not None and now_s - head.arrival_s > starvation_s:
            prio = math.inf
        dec = policy.decide(view, now_s)
        if isinstance(dec, Dispatch):
            key = (-prio, head.arrival_s)
            if best is None or key < best:
                n = len(view.requests)
                best, best_view, best_n = key, view, dec.n if dec.n < n else n
        else:
            waiting.append((prio, dec.t_s))
            if dec.t_s < wake:
                wake = dec.t_s
    if best is None or best_view is None:
        return NextBatch(None, 0, wake)
    best_prio = -best[0]
    # The earliest wake-up of a higher class than the winner's (inf: none).
    guard = math.inf
    for p, t in waiting:
        if p > best_prio and t < guard:
            guard = t
    prof = best_view.profile
    if guard < math.inf and prof is not None and now_s + prof.latency_s(best_n) > guard:
        return NextBatch(None, 0, wake)
    if class_headroom is not None and best_prio < math.inf:
        higher = sum(d for c, d in demand if c > best_prio)
        if higher > class_headroom:
            if rate_tau_s is not None:
                clear = now_s + rate_tau_s * math.log(higher / class_headroom) + 1e-6
                wake = min(wake, clear)
            return NextBatch(None, 0, wake)
    return NextBatch(best_view.model, best_n, wake)
