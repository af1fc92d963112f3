"""Routing policy protocol and registry.

A routing policy picks one backend for a request from views of the backends that host the
request's model (the framework filters out backends that do not host it or are unhealthy).
Policies may keep small state (a round-robin cursor, a seeded RNG) but never do I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from evenserve.core.types import BackendView, RequestInfo
from evenserve.policy.registry import Registry


@runtime_checkable
class RoutingPolicy(Protocol):
    def choose(
        self, request: RequestInfo, backends: Sequence[BackendView], now_s: float
    ) -> BackendView:
        """Return one of ``backends`` (never empty)."""
        ...


ROUTING: Registry[RoutingPolicy] = Registry("routing")


def rotating_argmin(keys: Sequence[float], start: int) -> int:
    """Index of the smallest key; ties go to the first one at or after ``start`` (cyclically).

    Rotating the tie-break start spreads requests across equally good backends instead of
    always favouring the first one listed.
    """
    n = len(keys)
    best_i = start % n
    best = keys[best_i]
    for k in range(1, n):
        i = (start + k) % n
        if keys[i] < best:
            best = keys[i]
            best_i = i
    return best_i
