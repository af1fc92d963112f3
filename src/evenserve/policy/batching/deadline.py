"""deadline: the largest batch that still meets the earliest deadline; wait only if it pays.

Each request's deadline is its own ``deadline_s`` or, if none, arrival + the model's SLO
(``QueueView.slo_s``); requests without either have no deadline.
Formula, with head-of-queue order (priority, then deadline, then arrival) and t(k) from the
profile:
- k* = the largest k <= cap such that now + t(k) + margin <= min(deadline of the first k);
  if even k = 1 cannot make it, k* = min(n, cap) (those requests are late whatever we do;
  serving them together frees the device soonest).
- Dispatch(k*) at once when the queue is full, when there is no rate estimate or profile,
  when waiting is disabled (``max_delay_ms`` = 0, the default), or when batches of n already
  keep up with the arrival rate (waiting would only add latency).
- Otherwise waiting can pay: wait until the expected arrival of the batch size that keeps up,
  but never past the latest start that still meets the earliest deadline with that batch,
  nor past ``max_delay_ms`` after the oldest arrival.
cap is ``max_batch_size`` cut to ``memory_fraction`` (0.85) of free memory. Waiting is off by
default for the reason given in ``adaptive``: on one model an idle device gains nothing by
waiting; what this policy adds is sizing batches to deadlines.
Params: ``max_batch_size`` (8), ``margin_ms`` (1), ``max_delay_ms`` (0),
``target_utilization`` (0.8), ``tau_ms`` (200), ``memory_fraction`` (0.85).
"""

from __future__ import annotations

import math

from pydantic import Field

from evenserve.core.types import BatchDecision, Dispatch, QueueView, RequestInfo, WaitUntil
from evenserve.policy.batching.base import BATCHING, BatchingPolicyBase
from evenserve.policy.batching.rate import RateEstimator
from evenserve.policy.batching.sizing import keeps_up, memory_cap, size_to_keep_up
from evenserve.policy.registry import PolicyParams


class DeadlineParams(PolicyParams):
    max_batch_size: int = Field(default=8, ge=1)
    margin_ms: float = Field(default=1.0, ge=0)
    max_delay_ms: float = Field(default=0.0, ge=0)
    target_utilization: float = Field(default=0.8, gt=0, le=1)
    tau_ms: float = Field(default=200.0, gt=0)
    memory_fraction: float = Field(default=0.85, gt=0, le=1)


def deadline_of(r: RequestInfo, slo_s: float | None) -> float:
    if r.deadline_s is not None:
        return r.deadline_s
    return math.inf if slo_s is None else r.arrival_s + slo_s


@BATCHING.register("deadline", DeadlineParams, "largest batch meeting the earliest deadline")
class DeadlineBatching(BatchingPolicyBase):
    __slots__ = ("_margin_s", "params", "rate")

    def __init__(self, params: DeadlineParams) -> None:
        self.params = params
        self.rate = RateEstimator(params.tau_ms / 1000.0)
        self._margin_s = params.margin_ms / 1000.0

    @property
    def max_batch_size(self) -> int:
        return self.params.max_batch_size

    def decide(self, queue: QueueView, now_s: float) -> BatchDecision:
        n = len(queue)
        if n == 0:
            return WaitUntil()
        p = self.params
        prof = queue.profile
        cap = memory_cap(prof, queue.memory_free_bytes, p.memory_fraction, p.max_batch_size)
        k_max = min(n, cap)
        if prof is None:
            return Dispatch(k_max)
        reqs = queue.requests
        slo = queue.slo_s
        earliest = math.inf
        best = 0
        for k in range(1, k_max + 1):
            earliest = min(earliest, deadline_of(reqs[k - 1], slo))
            if now_s + prof.latency_s(k) + self._margin_s <= earliest:
                best = k
        if best == 0:
            return Dispatch(k_max)
        if n >= cap:
            return Dispatch(best)
        r = self.rate.rate_at(now_s)
        if p.max_delay_ms <= 0 or r <= 0 or keeps_up(prof, n, r, p.target_utilization):
            return Dispatch(best)
        b = size_to_keep_up(prof, n + 1, cap, r, p.target_utilization)
        latest_start = earliest - prof.latency_s(b) - self._margin_s  # earliest of the first k_max
        due = min(now_s + (b - n) / r, latest_start, reqs[0].arrival_s + p.max_delay_ms / 1000.0)
        return Dispatch(best) if now_s >= due else WaitUntil(due)

    def on_arrival(self, now_s: float) -> None:
        self.rate.observe(now_s)
