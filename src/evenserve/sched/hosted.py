"""One hosted model as a device serves it, and the policy a draining device batches with."""

from __future__ import annotations

from typing import Generic, TypeVar

from evenserve.core.contention import occupancy
from evenserve.core.profile import LatencyProfile
from evenserve.core.profile_learning import ProfileLearner
from evenserve.core.types import QueueView
from evenserve.policy.batching import BATCHING, BatchingPolicy
from evenserve.sched.queues import ModelQueue, QueuedRequest

R = TypeVar("R", bound=QueuedRequest)


def flush(policy: BatchingPolicy) -> BatchingPolicy:
    """Drain mode: dispatch whatever is queued at once, up to ``policy``'s batch cap (the
    fixed-window policy with no window)."""
    spec = {"policy": "fixed-window", "max_batch_size": policy.max_batch_size}
    return BATCHING.build({**spec, "max_batch_delay_ms": 0})


class Hosted(Generic[R]):
    """One hosted model as this device serves it: its queue (maybe shared), this device's
    profile and the view its policy reads."""

    __slots__ = ("base", "costs", "lead_s", "learner", "mq", "policy", "profile", "view")

    def __init__(
        self, mq: ModelQueue[R], profile: LatencyProfile | None, learn: bool = False
    ) -> None:
        self.mq = mq
        self.policy: BatchingPolicy = mq.policy
        self.profile = profile
        #: The profile this device was given for the model (unlearned): learning starts
        #: from it, and turning learning off goes back to it.
        self.base = profile
        #: A request with a deadline is hopeless here once a batch of one can't make it.
        self.lead_s = profile.latency_s(1) if profile is not None else 0.0
        #: (seconds alone, working memory, occupancy) of a batch, by its items.
        self.costs: dict[int, tuple[float, float, float]] = {}
        self.view = QueueView(
            mq.name, mq.queue.items, profile, None, mq.setup.slo_s, None, mq.setup.priority
        )
        #: With learning on (and a profile to start from): this model's learned batch times
        #: here (``core.profile_learning``), which ``use_profile`` makes the profile.
        self.learner = ProfileLearner(profile) if learn and profile is not None else None

    def set_learning(self, on: bool, own_queue: bool) -> None:
        """Learning on: a fresh learner from the base profile; off: back to the base profile,
        the learner dropped. Either way the estimates start from the base profile again."""
        base = self.base
        if base is None:
            return
        self.learner = ProfileLearner(base) if on else None
        if self.profile is not base:
            self.use_profile(base, own_queue)

    def use_profile(self, profile: LatencyProfile, own_queue: bool) -> None:
        """From now on this device's estimates, its policy's view (and, when the queue is
        this device's alone, admission and the deadline watch) read ``profile``."""
        self.profile = profile
        self.costs.clear()
        self.lead_s = profile.latency_s(1)
        self.view.profile = profile
        if own_queue:
            self.mq.profile = profile
            self.mq.lead_s = self.lead_s

    def cost(self, items: int) -> tuple[float, float, float]:
        c = self.costs.get(items)
        if c is None:
            p = self.profile
            if p is None:
                return self.mq.observed_batch_s(items), 0.0, 1.0
            c = self.costs[items] = (
                p.latency_s(items),
                p.batch_memory_bytes(items),
                occupancy(p, items),
            )
        return c
