"""adaptive: the window follows the arrival rate, the latency profile and memory headroom.

Formula, for a queue of n requests with smoothed arrival rate r (decaying count, ``tau_ms``):
- cap = ``max_batch_size``, raised toward ``max_batch_cap`` when the queue is deeper (a burst
  is drained in bigger batches) but only while one batch takes at most ``slo_fraction`` (0.5)
  of the model's SLO (a batch that alone eats the SLO serves nobody in time), then cut to the
  largest batch whose profile working memory fits in ``memory_fraction`` (0.85) of the
  device's free memory.
- n >= cap: Dispatch(cap).
- If batches of n already keep up with r (r * t(n) / n <= ``target_utilization``), waiting
  would only add latency: Dispatch(n). This is the low-density case.
- Otherwise batches of n cannot keep up: wait for the smallest size b that keeps up, expected
  after (b - n) / r, but never longer than ``max_delay_ms`` after the oldest request arrived.
Without a profile or a rate estimate it dispatches at once.

Why the default ``max_delay_ms`` is 0. On one model whose batch time is a + b*n (or concave in
n), waiting while the device is idle never finishes anyone sooner: the requests that would
join a delayed batch arrive anyway while an immediate batch runs and form the next one, which
ends at about the same time, while the waiting batch's own requests end later. Greedy batches
grow by themselves under load (the queue fills while the device is busy). So by default the
policy is greedy with a cap that follows the queue (bursts drain in bigger batches) and memory
headroom; a positive ``max_delay_ms`` is for devices shared by several models, where fewer,
larger batches of one model leave the device to the others sooner.
Params: ``max_batch_size`` (8), ``max_batch_cap`` (32), ``slo_fraction`` (0.5),
``max_delay_ms`` (0),
``target_utilization`` (0.8), ``tau_ms`` (200), ``memory_fraction`` (0.85).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from evenserve.core.types import BatchDecision, Dispatch, QueueView, WaitUntil
from evenserve.policy.batching.base import BATCHING, BatchingPolicyBase
from evenserve.policy.batching.rate import RateEstimator
from evenserve.policy.batching.sizing import keeps_up, memory_cap, size_to_keep_up
from evenserve.policy.registry import PolicyParams


class AdaptiveParams(PolicyParams):
    max_batch_size: int = Field(default=8, ge=1)
    max_batch_cap: int = Field(default=32, ge=1)
    slo_fraction: float = Field(default=0.5, gt=0, le=1)
    max_delay_ms: float = Field(default=0.0, ge=0)
    target_utilization: float = Field(default=0.8, gt=0, le=1)
    tau_ms: float = Field(default=200.0, gt=0)
    memory_fraction: float = Field(default=0.85, gt=0, le=1)

    @model_validator(mode="after")
    def _caps(self) -> AdaptiveParams:
        if self.max_batch_cap < self.max_batch_size:
            raise ValueError("max_batch_cap must be >= max_batch_size")
        return self


@BATCHING.register("adaptive", AdaptiveParams, "window from arrival rate, profile and memory")
class Adaptive(BatchingPolicyBase):
    __slots__ = ("_max_delay_s", "params", "rate")

    def __init__(self, params: AdaptiveParams) -> None:
        self.params = params
        self.rate = RateEstimator(params.tau_ms / 1000.0)
        self._max_delay_s = params.max_delay_ms / 1000.0

    @property
    def max_batch_size(self) -> int:
        return self.params.max_batch_cap

    def cap(self, queue: QueueView) -> int:
        p = self.params
        cap = min(p.max_batch_cap, max(p.max_batch_size, len(queue)))
        prof = queue.profile
        if prof is not None and queue.slo_s is not None:
            budget = p.slo_fraction * queue.slo_s
            while cap > p.max_batch_size and prof.latency_s(cap) > budget:
                cap -= 1
        return memory_cap(prof, queue.memory_free_bytes, p.memory_fraction, cap)

    def decide(self, queue: QueueView, now_s: float) -> BatchDecision:
        n = len(queue)
        if n == 0:
            return WaitUntil()
        cap = self.cap(queue)
        if n >= cap:
            return Dispatch(cap)
        prof = queue.profile
        r = self.rate.rate_at(now_s)
        target = self.params.target_utilization
        if self._max_delay_s <= 0 or prof is None or r <= 0 or keeps_up(prof, n, r, target):
            return Dispatch(n)
        b = size_to_keep_up(prof, n + 1, cap, r, target)
        due = min(queue.requests[0].arrival_s + self._max_delay_s, now_s + (b - n) / r)
        return Dispatch(n) if now_s >= due else WaitUntil(due)

    def on_arrival(self, now_s: float) -> None:
        self.rate.observe(now_s)
