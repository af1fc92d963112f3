"""least-connections: the backend with the fewest requests this router has outstanding.

Formula: argmin_b in_flight(b); ties rotate. Signals read: the router's own in-flight count
(what a plain L7 proxy knows). Params: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from evenserve.core.types import BackendView, RequestInfo
from evenserve.policy.registry import PolicyParams
from evenserve.policy.routing.base import ROUTING, rotating_argmin


class LeastConnectionsParams(PolicyParams):
    pass


@ROUTING.register("least-connections", LeastConnectionsParams, "fewest outstanding requests")
class LeastConnections:
    def __init__(self, params: LeastConnectionsParams) -> None:
        self.params = params
        self._tick = 0

    def choose(
        self, request: RequestInfo, backends: Sequence[BackendView], now_s: float
    ) -> BackendView:
        self._tick += 1
        return backends[rotating_argmin([b.in_flight for b in backends], self._tick)]
