"""Routing policies; importing this package registers every built-in policy."""

from evenserve.policy.routing import (  # noqa: F401  (import registers the policies)
    least_connections,
    least_expected_work,
    power_of_two,
    queue_aware,
    round_robin,
    weighted_random,
)
from evenserve.policy.routing.base import ROUTING, RoutingPolicy
from evenserve.policy.routing.router import Router

__all__ = ["ROUTING", "Router", "RoutingPolicy"]
