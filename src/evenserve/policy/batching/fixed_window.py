"""fixed-window: Triton-style dynamic batching with a fixed maximum delay.

Formula: Dispatch(max_batch_size) when that many wait; otherwise Dispatch(all) once the oldest
request has waited ``max_batch_delay_ms``; otherwise wait until then.
Params: ``max_batch_size`` (8), ``max_batch_delay_ms`` (80, the articles' setting).
"""

from __future__ import annotations

from pydantic import Field

from evenserve.core.types import NO_WAKE, BatchDecision, QueueView, WaitUntil, dispatch
from evenserve.policy.batching.base import BATCHING, BatchingPolicyBase
from evenserve.policy.registry import PolicyParams


def window_decision(
    queue: QueueView, now_s: float, max_batch: int, delay_s: float
) -> BatchDecision:
    """Full batch now; else everything once the oldest waited ``delay_s``; else wait till then."""
    requests = queue.requests
    n = len(requests)
    if n == 0:
        return NO_WAKE
    if n >= max_batch:
        return dispatch(max_batch)
    due = requests[0].arrival_s + delay_s
    return dispatch(n) if now_s >= due else WaitUntil(due)


class FixedWindowParams(PolicyParams):
    max_batch_size: int = Field(default=8, ge=1)
    max_batch_delay_ms: float = Field(default=80.0, ge=0)


@BATCHING.register("fixed-window", FixedWindowParams, "dispatch when full or oldest waited delay")
class FixedWindow(BatchingPolicyBase):
    __slots__ = ("_delay_s", "_full", "_max", "_wait", "params")

    arrivals_keep_wait = True  # its wait is the head's window (BatchingPolicyBase)

    def __init__(self, params: FixedWindowParams) -> None:
        self.params = params
        # The frozen params read once: a pydantic model's attribute read is a slow path.
        self._max = params.max_batch_size
        #: The decision for a full batch.
        self._full = dispatch(self._max)
        self._delay_s = params.max_batch_delay_ms / 1000.0
        #: The last WaitUntil answered: while the same request heads the queue, the same
        #: wake-up (asked per arrival to a device waiting on its window).
        self._wait = NO_WAKE

    @property
    def max_batch_size(self) -> int:
        return self._max

    def decide(self, queue: QueueView, now_s: float) -> BatchDecision:
        # window_decision, with the last WaitUntil kept.
        requests = queue.requests
        n = len(requests)
        if n == 0:
            return NO_WAKE
        if n >= self._max:
            return self._full
        due = requests[0].arrival_s + self._delay_s
        if now_s >= due:
            return dispatch(n)
        wait = self._wait
        if wait.t_s != due:
            wait = self._wait = WaitUntil(due)
        return wait
