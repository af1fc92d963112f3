"""Which model's batch a free device runs next: shared by the simulator and the live worker.

A device is shared by the models placed on it and runs one batch at a time (per instance).
When an instance is free, each hosted model's batching policy is asked about its own queue.
Among the models whose policy says Dispatch, the one whose oldest waiting request has the
highest priority, then the earliest arrival, goes first (FIFO across models within a class).
If none is ready, the answer is the earliest time any policy asked to be woken.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from evenserve.core.types import Dispatch, QueueView
from evenserve.policy.batching.base import BatchingPolicy


@dataclass(frozen=True, slots=True)
class NextBatch:
    """Run ``n`` requests of ``model`` now (``model`` is None when nothing is ready)."""

    model: str | None
    n: int
    wake_s: float = math.inf


IDLE = NextBatch(None, 0)


def next_batch(queues: Iterable[tuple[QueueView, BatchingPolicy]], now_s: float) -> NextBatch:
    best_model: str | None = None
    best_n = 0
    best_key = (math.inf, math.inf)
    wake = math.inf
    for view, policy in queues:
        if not view.requests:
            continue
        dec = policy.decide(view, now_s)
        if isinstance(dec, Dispatch):
            head = view.requests[0]
            key = (-float(head.priority), head.arrival_s)
            if key < best_key:
                best_model, best_n, best_key = view.model, min(dec.n, len(view.requests)), key
        elif dec.t_s < wake:
            wake = dec.t_s
    if best_model is None:
        return NextBatch(None, 0, wake)
    return NextBatch(best_model, best_n, wake)
