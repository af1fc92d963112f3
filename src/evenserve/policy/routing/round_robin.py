"""round-robin: each model's requests go to its hosting backends in turn.

Formula: backend = hosts[k mod len(hosts)] for the k-th request of the model.
Signals read: none. Params: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from evenserve.core.types import BackendView, RequestInfo
from evenserve.policy.registry import PolicyParams
from evenserve.policy.routing.base import ROUTING


class RoundRobinParams(PolicyParams):
    pass


@ROUTING.register("round-robin", RoundRobinParams, "each model's hosts in turn")
class RoundRobin:
    def __init__(self, params: RoundRobinParams) -> None:
        self.params = params
        self._cursor: dict[str, int] = {}

    def choose(
        self, request: RequestInfo, backends: Sequence[BackendView], now_s: float
    ) -> BackendView:
        k = self._cursor.get(request.model, 0)
        self._cursor[request.model] = k + 1
        return backends[k % len(backends)]
