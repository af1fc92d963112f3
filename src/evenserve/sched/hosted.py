"""One hosted model as a device serves it, and the policy a draining device batches with."""

from __future__ import annotations

from typing import Generic, TypeVar

from evenserve.core.contention import occupancy
from evenserve.core.profile import LatencyProfile
from evenserve.core.types import BatchDecision, Dispatch, QueueView, WaitUntil
from evenserve.policy.batching import BatchingPolicy
from evenserve.sched.queues import ModelQueue, QueuedRequest

R = TypeVar("R", bound=QueuedRequest)


class Flush:
    """Drain mode: dispatch whatever is queued, up to the policy's batch cap."""

    name = "flush"

    def __init__(self, inner: BatchingPolicy) -> None:
        self._cap = inner.max_batch_size

    @property
    def max_batch_size(self) -> int:
        return self._cap

    def decide(self, queue: QueueView, now_s: float) -> BatchDecision:
        n = len(queue)
        return Dispatch(min(n, self._cap)) if n else WaitUntil()

    def on_arrival(self, now_s: float) -> None:
        return None

    def on_dispatch(self, n: int, now_s: float) -> None:
        return None


class Hosted(Generic[R]):
    """One hosted model as this device serves it: its queue (maybe shared), this device's
    profile and the view its policy reads."""

    __slots__ = ("costs", "lead_s", "mq", "policy", "profile", "view")

    def __init__(self, mq: ModelQueue[R], profile: LatencyProfile | None) -> None:
        self.mq = mq
        self.policy: BatchingPolicy = mq.policy
        self.profile = profile
        #: A request with a deadline is hopeless here once a batch of one can't make it.
        self.lead_s = profile.latency_s(1) if profile is not None else 0.0
        #: (seconds alone, working memory, occupancy) of a batch, by its items.
        self.costs: dict[int, tuple[float, float, float]] = {}
        self.view = QueueView(
            mq.name, mq.queue.items, profile, None, True, mq.setup.slo_s, None, mq.setup.priority
        )

    def cost(self, items: int) -> tuple[float, float, float]:
        c = self.costs.get(items)
        if c is None:
            p = self.profile
            if p is None:
                return self.mq.estimate_batch_s(items), 0.0, 1.0
            c = self.costs[items] = (
                p.latency_s(items),
                p.batch_memory_bytes(items),
                occupancy(p, items),
            )
        return c
