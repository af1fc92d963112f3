"""Batching policies; importing this package registers every built-in policy."""

from evenserve.policy.batching import (  # noqa: F401  (import registers the policies)
    adaptive,
    deadline,
    fixed_window,
    none,
    static,
    step_down,
)
from evenserve.policy.batching.base import BATCHING, BatchingPolicy

__all__ = ["BATCHING", "BatchingPolicy"]
