"""Placement policies (which models are resident where) and autoscalers; see ``base``.

Importing this package registers every built-in one: placement ``static``, ``lru``,
``cost-aware``; autoscaling ``none``, ``demand``.
"""

from evenserve.policy.placement import (  # noqa: F401  (import registers the policies)
    autoscale,
    cost_aware,
    lru,
    static,
)
from evenserve.policy.placement.base import (
    AUTOSCALING,
    LOADING,
    PLACEMENT,
    READY,
    UNLOADING,
    Action,
    Autoscaler,
    ClusterView,
    DeviceView,
    Load,
    ModelInfo,
    PlacementError,
    PlacementPolicy,
    ScaleAction,
    ScaleDown,
    ScaleUp,
    Unload,
    check_actions,
)

__all__ = [
    "AUTOSCALING",
    "LOADING",
    "PLACEMENT",
    "READY",
    "UNLOADING",
    "Action",
    "Autoscaler",
    "ClusterView",
    "DeviceView",
    "Load",
    "ModelInfo",
    "PlacementError",
    "PlacementPolicy",
    "ScaleAction",
    "ScaleDown",
    "ScaleUp",
    "Unload",
    "check_actions",
]
