"""Hand-built placement views and a tiny driver that applies actions between calls."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from evenserve.policy.placement import (
    LOADING,
    READY,
    UNLOADING,
    Action,
    ClusterView,
    DeviceView,
    Load,
    ModelInfo,
)

GIB = 2.0**30


def model(
    name: str, gb: float, *, cold_s: float = 4.0, warm_s: float = 1.0, cap_rps: float = 10.0
) -> ModelInfo:
    """A model of ``gb`` GiB serving ``cap_rps`` requests per second per replica."""
    return ModelInfo(name, gb * GIB, cold_s, warm_s, batch_s=1.0 / cap_rps, max_batch_size=1)


def device(
    name: str,
    gb: float,
    models: Mapping[str, str] | Iterable[str] = (),
    *,
    used: Mapping[str, float] | None = None,
    outstanding: Mapping[str, int] | None = None,
    util: float = 0.0,
    active: bool = True,
) -> DeviceView:
    states = dict(models) if isinstance(models, Mapping) else dict.fromkeys(models, READY)
    return DeviceView(
        name,
        gb * GIB,
        states,
        last_used_s=dict(used or {}),
        outstanding=dict(outstanding or {}),
        utilization=util,
        active=active,
    )


def step(view: ClusterView, actions: Iterable[Action], now_s: float) -> ClusterView:
    """The driver between two calls: what was LOADING is READY now and what was UNLOADING is
    gone; then each Load makes its model LOADING, each Unload removes it."""
    devices = []
    acts = list(actions)
    for d in view.devices:
        models = {m: READY for m, s in d.models.items() if s != UNLOADING}
        for a in acts:
            if a.device != d.name:
                continue
            if isinstance(a, Load):
                models[a.model] = LOADING
            else:
                models.pop(a.model, None)
        devices.append(
            DeviceView(
                d.name,
                d.memory_total_bytes,
                models,
                dict(d.last_used_s),
                {m: n for m, n in d.outstanding.items() if m in models},
                d.utilization,
                d.active,
            )
        )
    return ClusterView(now_s, view.models, devices, view.rate_rps, view.warm)
