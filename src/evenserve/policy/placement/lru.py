"""lru: device memory as a cache of models, evicted least recently used first (ModelMesh-like).

``on_miss(m)``: on every active device where m is not resident, take its evictable residents
(READY, no request outstanding there) oldest ``last_used_s`` first (a model never used there
counts as used when this policy loaded it, else as never; ties: name) and unload the shortest
prefix of that order after which m fits. Pick the device needing the fewest evictions, ties
by most free bytes after the load, then name. No device where m fits even after evicting
every evictable resident: ``[]``.

``rebalance``: with ``idle_evict_s`` set, unload every evictable resident idle for longer
than that: ``now - max(last_used_s, loaded_at) > idle_evict_s`` (``loaded_at``: when this
policy issued its load, so a model just loaded for a waiting request is not taken away before
that request is sent). Default: off (a pure cache changes only on misses).
"""

from __future__ import annotations

import math

from pydantic import Field

from evenserve.policy.placement.base import PLACEMENT, Action, ClusterView, Load, Unload
from evenserve.policy.placement.common import (
    argmin,
    evict_in_order,
    evictable,
    free_after,
    plan,
    targets,
)
from evenserve.policy.registry import PolicyParams


class LruParams(PolicyParams):
    idle_evict_s: float | None = Field(default=None, gt=0)


@PLACEMENT.register("lru", LruParams, "a cache of models: least recently used evicted first")
class LruPlacement:
    def __init__(self, params: LruParams) -> None:
        self.params = params
        self._loaded_at: dict[tuple[str, str], float] = {}

    def _last_used(self, view: ClusterView, model: str, device: str) -> float:
        used = view.device(device).last_used_s.get(model, -math.inf)
        return max(used, self._loaded_at.get((model, device), -math.inf))

    def on_miss(self, model: str, view: ClusterView) -> list[Action]:
        if view.hosts(model):
            return []
        options = []
        for d in targets(view, model):
            order = sorted(evictable(d), key=lambda m: (self._last_used(view, m, d.name), m))
            victims = evict_in_order(d, view.models, model, order)
            if victims is None:
                continue
            key = (len(victims), -free_after(d, view.models, model, victims), d.name)
            options.append((key, plan(model, d.name, victims)))
        actions = argmin(options)
        self._record(view.now_s, actions)
        return actions

    def rebalance(self, view: ClusterView) -> list[Action]:
        limit = self.params.idle_evict_s
        if limit is None:
            return []
        actions: list[Action] = [
            Unload(m, d.name)
            for d in view.devices
            if d.active
            for m in evictable(d)
            if view.now_s - self._last_used(view, m, d.name) > limit
        ]
        self._record(view.now_s, actions)
        return actions

    def _record(self, now_s: float, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Load):
                self._loaded_at[(a.model, a.device)] = now_s
            else:
                self._loaded_at.pop((a.model, a.device), None)
