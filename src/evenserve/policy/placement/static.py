"""static: the baseline: models stay where they are put.

``on_miss(m)``: among the active devices where m is not resident and fits in the free memory
as it is (no eviction, ever), the one with the most free bytes after the load (ties: name
order); none: ``[]`` (the request is refused with Retry-After). ``rebalance``: nothing, so the
placement is the devices' configured models plus whatever misses added. Params: none.
"""

from __future__ import annotations

from evenserve.policy.placement.base import PLACEMENT, Action, ClusterView
from evenserve.policy.placement.common import argmin, fits, free_after, plan, targets
from evenserve.policy.registry import PolicyParams


class StaticParams(PolicyParams):
    pass


@PLACEMENT.register("static", StaticParams, "configured models; misses fill free memory only")
class StaticPlacement:
    def __init__(self, params: StaticParams) -> None:
        self.params = params

    def on_miss(self, model: str, view: ClusterView) -> list[Action]:
        if view.hosts(model):
            return []
        return argmin(
            ((-free_after(d, view.models, model, ()), d.name), plan(model, d.name, ()))
            for d in targets(view, model)
            if fits(d, view.models, model, ())
        )

    def rebalance(self, view: ClusterView) -> list[Action]:
        return []
