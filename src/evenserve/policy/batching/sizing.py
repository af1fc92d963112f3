"""Batch-size arithmetic from a latency profile, shared by the adaptive and deadline policies.

- ``memory_cap``: the largest batch whose working memory fits in ``fraction`` of the device's
  free memory (never below 1: a batch of one is always allowed to try).
- ``keeps_up``: whether batches of ``n`` can serve an arrival rate ``rate`` at a target
  utilization, i.e. rate * t(n) / n <= target. If greedy batches of the current queue keep up,
  waiting for more requests only adds latency.
- ``size_to_keep_up``: the smallest batch size in [lo, hi] that keeps up (hi if none does).
"""

from __future__ import annotations

from evenserve.core.profile import LatencyProfile


def memory_cap(
    profile: LatencyProfile | None, free_bytes: float | None, fraction: float, hi: int
) -> int:
    if profile is None or free_bytes is None:
        return hi
    budget = fraction * free_bytes
    n = hi
    while n > 1 and profile.batch_memory_bytes(n) > budget:
        n -= 1
    return n


def keeps_up(profile: LatencyProfile, n: int, rate_rps: float, target: float) -> bool:
    return rate_rps * profile.latency_s(n) / max(1, n) <= target


def size_to_keep_up(
    profile: LatencyProfile, lo: int, hi: int, rate_rps: float, target: float
) -> int:
    for b in range(max(1, lo), hi + 1):
        if keeps_up(profile, b, rate_rps, target):
            return b
    return hi
