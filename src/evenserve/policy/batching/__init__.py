"""Batching policies; importing this package registers every built-in policy."""

from evenserve.policy.batching import fixed_window, none, static  # noqa: F401
from evenserve.policy.batching.base import BATCHING, BatchingPolicy

__all__ = ["BATCHING", "BatchingPolicy"]
