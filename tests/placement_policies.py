"""Test-only placement policy and autoscaler (the real ones live in evenserve.policy.placement
once merged). Registered under ``test-`` names on import.

- ``test-fit-or-evict``: on a miss, load on the first active device (by name; one where the
  model is not resident in any state) where it fits; else on the first active device where
  unloading idle READY residents (least recently used first) makes room: those unloads, then
  the load. Rebalance: nothing.
- ``test-scheduled``: turn ``up`` devices on from ``up_at_s`` until ``down_at_s``, and
  ``down`` devices off from ``down_at_s`` (a fixed schedule: tests know the device time).
"""

from __future__ import annotations

from evenserve.policy.placement import (
    AUTOSCALING,
    PLACEMENT,
    READY,
    Action,
    ClusterView,
    Load,
    ScaleAction,
    ScaleDown,
    ScaleUp,
    Unload,
)
from evenserve.policy.registry import PolicyParams


class FitOrEvictParams(PolicyParams):
    pass


@PLACEMENT.register("test-fit-or-evict", FitOrEvictParams, "tests: fit, else evict idle LRU")
class FitOrEvict:
    def __init__(self, params: FitOrEvictParams) -> None:
        self.params = params

    def on_miss(self, model: str, view: ClusterView) -> list[Action]:
        info = view.models
        active = sorted(
            (d for d in view.devices if d.active and model not in d.models), key=lambda d: d.name
        )

        def fits(kept: list[str], total: float) -> bool:
            # Summed as check_actions sums them (the same order: the same float).
            return sum(info[m].weights_bytes for m in [*kept, model]) <= total

        for d in active:
            if fits(list(d.models), d.memory_total_bytes):
                return [Load(model, d.name)]
        for d in active:
            idle = sorted(
                (m for m, s in d.models.items() if s == READY and not d.outstanding.get(m)),
                key=lambda m: (d.last_used_s.get(m, -1.0), m),
            )
            gone: list[str] = []
            for m in idle:
                if fits([k for k in d.models if k not in gone], d.memory_total_bytes):
                    break
                gone.append(m)
            if fits([k for k in d.models if k not in gone], d.memory_total_bytes):
                return [*(Unload(m, d.name) for m in gone), Load(model, d.name)]
        return []

    def rebalance(self, view: ClusterView) -> list[Action]:
        return []


class ScheduledParams(PolicyParams):
    up: tuple[str, ...] = ()
    up_at_s: float = 0.0
    down: tuple[str, ...] = ()
    down_at_s: float = float("inf")


@AUTOSCALING.register("test-scheduled", ScheduledParams, "tests: devices on and off at set times")
class Scheduled:
    def __init__(self, params: ScheduledParams) -> None:
        self.p = params

    def decide(self, view: ClusterView) -> list[ScaleAction]:
        out: list[ScaleAction] = []
        if self.p.up_at_s <= view.now_s < self.p.down_at_s:
            out += [ScaleUp(d) for d in self.p.up if not view.device(d).active]
        if view.now_s >= self.p.down_at_s:
            out += [ScaleDown(d) for d in self.p.down if view.device(d).active]
        return out
