"""Placement policies (which models are resident where); see ``base``."""

from evenserve.policy.placement.base import (
    LOADING,
    PLACEMENT,
    READY,
    UNLOADING,
    Action,
    ClusterView,
    DeviceView,
    Load,
    ModelInfo,
    PlacementError,
    PlacementPolicy,
    Unload,
    check_actions,
)

__all__ = [
    "LOADING",
    "PLACEMENT",
    "READY",
    "UNLOADING",
    "Action",
    "ClusterView",
    "DeviceView",
    "Load",
    "ModelInfo",
    "PlacementError",
    "PlacementPolicy",
    "Unload",
    "check_actions",
]
