"""lru: device memory as a cache of models, evicted least recently used first (ModelMesh-like).

``on_miss(m)``: on every active device where m is not resident, take its evictable residents
(READY, no request outstanding there) oldest ``last_used_s`` first (a model never used there
counts as used when this policy loaded it, else as never; ties: name) and unload the shortest
prefix of that order after which m fits. Pick the device needing the fewest evictions, ties
by most free bytes after the load, then name. No device where m fits even after evicting
every evictable resident: ``[]``.

``rebalance``, three rules in this order:

- **idle** (with ``idle_evict_s`` set): unload every evictable resident idle for longer than
  that: ``now - max(last_used_s, loaded_at) > idle_evict_s`` (``loaded_at``: when this policy
  issued its load, so a model just loaded for a waiting request is not taken away before
  that request is sent). Default: off.
- **copies up** (ModelMesh's load-based scale-up; ``scaleup_rps_per_copy``, ModelMesh's
  ``scaleup_rpm_threshold`` of 2000 requests per minute by default, ``None``: off): a model
  with ``R`` copies (READY or LOADING on active devices), none LOADING, whose rate per copy
  ``r / R`` exceeds the threshold gets ``min(floor(r / R / threshold), max(2, active // 3))``
  more copies at once (ModelMesh caps a scale-up at max(2, a third of the cluster)), each
  where a miss would go (the LRU evictions above), one device each.
- **copies down**: a model with ``R >= 2`` copies whose rate would stay under
  ``scaledown_fraction`` (0.5) of the threshold per copy with one copy fewer
  (``r / (R - 1) < scaledown_fraction * threshold``) loses its least recently used copy
  without outstanding requests. The gap between the two thresholds and ``hold_s`` (10 s: no
  copy count changes within it of the last change of that model's copies) keep it from
  flapping.

A pure cache otherwise: nothing is evicted for cost, only by recency, on a miss or to make
room for a copy.
"""

from __future__ import annotations

import math

from pydantic import Field

from evenserve.policy.placement.base import (
    LOADING,
    PLACEMENT,
    Action,
    ClusterView,
    Load,
    Unload,
)
from evenserve.policy.placement.common import (
    apply_actions,
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
    #: ModelMesh's ``scaleup_rpm_threshold`` (2000 requests per minute), per second; None: off.
    scaleup_rps_per_copy: float | None = Field(default=2000.0 / 60.0, gt=0)
    scaledown_fraction: float = Field(default=0.5, gt=0, lt=1)
    hold_s: float = Field(default=10.0, ge=0)


@PLACEMENT.register("lru", LruParams, "a cache of models: least recently used evicted first")
class LruPlacement:
    def __init__(self, params: LruParams) -> None:
        self.params = params
        self._loaded_at: dict[tuple[str, str], float] = {}
        #: When each model's copy count last changed by rebalance (the hold).
        self._copies_changed: dict[str, float] = {}

    def _last_used(self, view: ClusterView, model: str, device: str) -> float:
        used = view.device(device).last_used_s.get(model, -math.inf)
        return max(used, self._loaded_at.get((model, device), -math.inf))

    def on_miss(self, model: str, view: ClusterView) -> list[Action]:
        if view.hosts(model):
            return []
        actions = self._where(model, view)
        self._record(view.now_s, actions)
        return actions

    def _where(
        self, model: str, view: ClusterView, taken: frozenset[str] = frozenset()
    ) -> list[Action]:
        """One load of ``model`` where the fewest LRU evictions make room (not on ``taken``)."""
        options = []
        for d in targets(view, model):
            if d.name in taken:
                continue
            order = sorted(evictable(d), key=lambda m: (self._last_used(view, m, d.name), m))
            victims = evict_in_order(d, view.models, model, order)
            if victims is None:
                continue
            key = (len(victims), -free_after(d, view.models, model, victims), d.name)
            options.append((key, plan(model, d.name, victims)))
        return argmin(options)

    def rebalance(self, view: ClusterView) -> list[Action]:
        actions: list[Action] = []
        limit = self.params.idle_evict_s
        if limit is not None:
            actions = [
                Unload(m, d.name)
                for d in view.devices
                if d.active
                for m in evictable(d)
                if view.now_s - self._last_used(view, m, d.name) > limit
            ]
        if self.params.scaleup_rps_per_copy is not None:
            actions += self._copies(apply_actions(view, actions), actions)
        self._record(view.now_s, actions)
        return actions

    def _copies(self, view: ClusterView, before: list[Action]) -> list[Action]:
        """ModelMesh's load-based copies (module docstring): up, then down. Nothing is undone
        in one call: a model is not loaded back where this call (or ``before``) unloads it."""
        p, now = self.params, view.now_s
        threshold = p.scaleup_rps_per_copy
        assert threshold is not None
        active = sum(1 for d in view.devices if d.active)
        cap = max(2, active // 3)
        actions: list[Action] = []
        for m in sorted(view.models):
            rate = view.rate_rps.get(m, 0.0)
            hosts = view.hosts(m)
            copies = len(hosts)
            if copies == 0 or now - self._copies_changed.get(m, -math.inf) < p.hold_s:
                continue
            if any(h.models.get(m) == LOADING for h in hosts):
                continue
            if rate / copies > threshold:
                more = min(int(rate / copies / threshold), cap)
                gone = {a.device for a in [*before, *actions] if a.model == m}
                taken: set[str] = set()
                for _ in range(more):
                    step = self._where(m, view, frozenset(taken | gone))
                    if not step:
                        break
                    taken.add(step[-1].device)
                    actions += step
                    view = apply_actions(view, step)
                if taken:
                    self._copies_changed[m] = now
            elif copies >= 2 and rate / (copies - 1) < p.scaledown_fraction * threshold:
                touched = {a.device for a in [*before, *actions] if a.model == m}
                spare = [
                    h
                    for h in hosts
                    if h.ready(m) and h.outstanding.get(m, 0) == 0 and h.name not in touched
                ]
                if not spare:
                    continue
                victim = min(spare, key=lambda h: (self._last_used(view, m, h.name), h.name))
                step = [Unload(m, victim.name)]
                actions += step
                view = apply_actions(view, step)
                self._copies_changed[m] = now
        return actions

    def _record(self, now_s: float, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Load):
                self._loaded_at[(a.model, a.device)] = now_s
            else:
                self._loaded_at.pop((a.model, a.device), None)
