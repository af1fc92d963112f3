"""Batching policy protocol and registry.

A batching policy looks at one model's queue on one device, at a moment when the device could
start a batch, and answers ``Dispatch(n)`` (run the ``n`` oldest now) or ``WaitUntil(t)``
(ask me again at ``t``, or sooner if the queue changes). Drivers call ``decide`` again after
every arrival and every batch completion, so a policy never needs timers of its own.
Optional hooks let stateful policies learn: ``on_arrival`` and ``on_dispatch``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from evenserve.core.types import BatchDecision, QueueView
from evenserve.policy.registry import Registry


@runtime_checkable
class BatchingPolicy(Protocol):
    @property
    def max_batch_size(self) -> int: ...

    def decide(self, queue: QueueView, now_s: float) -> BatchDecision: ...

    def on_arrival(self, now_s: float) -> None: ...

    def on_dispatch(self, n: int, now_s: float) -> None: ...


class BatchingPolicyBase:
    """No-op hooks for policies that keep no state.

    ``arrivals_keep_wait``: True for a policy whose answer, once it is ``WaitUntil(t)``, stays
    that while the same request heads the queue, fewer than ``max_batch_size`` wait and the
    clock is before ``t`` (fixed-window: its wait is the head's window). A scheduler may
    then skip asking it again on such an arrival.
    """

    __slots__ = ()

    arrivals_keep_wait = False

    def on_arrival(self, now_s: float) -> None:
        return None

    def on_dispatch(self, n: int, now_s: float) -> None:
        return None


BATCHING: Registry[BatchingPolicy] = Registry("batching")
