"""none: no batching; every request runs alone as soon as the device is free.

Formula: Dispatch(1) when the queue is non-empty. Params: none.
"""

from __future__ import annotations

from evenserve.core.types import BatchDecision, Dispatch, QueueView, WaitUntil
from evenserve.policy.batching.base import BATCHING, BatchingPolicyBase
from evenserve.policy.registry import PolicyParams


class NoBatchingParams(PolicyParams):
    pass


@BATCHING.register("none", NoBatchingParams, "batch of one, no waiting")
class NoBatching(BatchingPolicyBase):
    __slots__ = ("params",)

    max_batch_size = 1

    def __init__(self, params: NoBatchingParams) -> None:
        self.params = params

    def decide(self, queue: QueueView, now_s: float) -> BatchDecision:
        return Dispatch(1) if len(queue) else WaitUntil()
