"""static: wait for exactly ``batch_size`` requests (the articles' baseline uses 4).

Formula: Dispatch(batch_size) once the queue holds that many; otherwise wait. If
``max_wait_ms`` is set, a partial batch goes once its oldest request has waited that long
(otherwise a lone request at the end of a run could wait forever).
Params: ``batch_size`` (4), ``max_wait_ms`` (None: wait for a full batch).
"""

from __future__ import annotations

import math

from pydantic import Field

from evenserve.core.types import BatchDecision, Dispatch, QueueView, WaitUntil
from evenserve.policy.batching.base import BATCHING, BatchingPolicyBase
from evenserve.policy.registry import PolicyParams


class StaticParams(PolicyParams):
    batch_size: int = Field(default=4, ge=1)
    max_wait_ms: float | None = Field(default=None, gt=0)


@BATCHING.register("static", StaticParams, "exactly N per batch")
class StaticBatching(BatchingPolicyBase):
    __slots__ = ("_max_wait_s", "params")

    def __init__(self, params: StaticParams) -> None:
        self.params = params
        self._max_wait_s = None if params.max_wait_ms is None else params.max_wait_ms / 1000.0

    @property
    def max_batch_size(self) -> int:
        return self.params.batch_size

    def decide(self, queue: QueueView, now_s: float) -> BatchDecision:
        n = len(queue)
        if n >= self.params.batch_size:
            return Dispatch(self.params.batch_size)
        if n == 0 or self._max_wait_s is None:
            return WaitUntil(math.inf)
        due = queue.requests[0].arrival_s + self._max_wait_s
        return Dispatch(n) if now_s >= due else WaitUntil(due)
