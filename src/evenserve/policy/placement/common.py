"""Helpers the placement policies share: where a model may go, what may leave, what fits.

All of them are pure functions of a ``ClusterView``. ``fits`` sums the device bytes
(weights, and an engine's KV cache) in the same order as ``check_actions`` does (the
device's residents in their order, less the ones that leave, then the newcomer), so a plan
the helpers accept is one ``check_actions`` accepts, to the last bit of floating point.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from evenserve.policy.placement.base import (
    LOADING,
    READY,
    Action,
    ClusterView,
    DeviceView,
    Load,
    ModelInfo,
    Unload,
)


def targets(view: ClusterView, model: str) -> list[DeviceView]:
    """Active devices where ``model`` is not resident in any state and not pinned (a Load
    may go there)."""
    return [d for d in view.devices if d.active and model not in d.models and model not in d.pinned]


def evictable(device: DeviceView) -> list[str]:
    """Residents that may be unloaded now: READY with no request outstanding here and not
    pinned (never a model still LOADING, nor one already UNLOADING), in name order."""
    return sorted(
        m
        for m, s in device.models.items()
        if s == READY and device.outstanding.get(m, 0) == 0 and m not in device.pinned
    )


def fits(
    device: DeviceView, models: Mapping[str, ModelInfo], model: str, leaving: Iterable[str]
) -> bool:
    """Whether ``model`` fits on ``device`` once ``leaving`` have been unloaded."""
    gone = set(leaving)
    kept = [m for m in device.models if m not in gone]
    used = sum(models[m].device_bytes for m in [*kept, model])
    return used <= device.memory_total_bytes


def free_after(
    device: DeviceView, models: Mapping[str, ModelInfo], model: str, leaving: Iterable[str]
) -> float:
    """Bytes left free on ``device`` once ``leaving`` are gone and ``model`` is loaded."""
    gone = set(leaving)
    kept = [m for m in device.models if m not in gone]
    return device.memory_total_bytes - sum(models[m].device_bytes for m in [*kept, model])


def evict_in_order(
    device: DeviceView, models: Mapping[str, ModelInfo], model: str, order: Sequence[str]
) -> list[str] | None:
    """The shortest prefix of ``order`` whose unloading makes ``model`` fit, or None when
    even all of them are not enough."""
    for k in range(len(order) + 1):
        if fits(device, models, model, order[:k]):
            return list(order[:k])
    return None


def prune(
    device: DeviceView, models: Mapping[str, ModelInfo], model: str, victims: Sequence[str]
) -> list[str]:
    """Drop, last chosen first, every victim the load does not need after all (a greedy
    pick may take a small model before a large one that alone would have been enough)."""
    kept = list(victims)
    for m in reversed(victims):
        rest = [v for v in kept if v != m]
        if fits(device, models, model, rest):
            kept = rest
    return kept


def plan(model: str, device: str, victims: Iterable[str]) -> list[Action]:
    """The actions of one placement: the unloads first, then the load that needs the room."""
    return [*(Unload(v, device) for v in victims), Load(model, device)]


def apply_actions(view: ClusterView, actions: Iterable[Action]) -> ClusterView:
    """The view as it would be once ``actions`` are issued: a Load makes the model LOADING
    on its device, an Unload removes it. (A policy plans several changes in one rebalance on
    this; the driver reports the truth in the next view.)"""
    models = {d.name: dict(d.models) for d in view.devices}
    pinned = {d.name: set(d.pinned) for d in view.devices}
    for a in actions:
        if view.min_switch_s > 0:
            pinned[a.device].add(a.model)
        here = models[a.device]
        if isinstance(a, Load):
            here[a.model] = LOADING
        else:
            here.pop(a.model, None)
    devices = [
        DeviceView(
            name=d.name,
            memory_total_bytes=d.memory_total_bytes,
            models=models[d.name],
            last_used_s=dict(d.last_used_s),
            outstanding=dict(d.outstanding),
            utilization=d.utilization,
            active=d.active,
            pinned=frozenset(pinned[d.name]),
        )
        for d in view.devices
    ]
    return ClusterView(
        view.now_s, view.models, devices, view.rate_rps, view.warm,
        min_switch_s=view.min_switch_s, observed_s=view.observed_s,
    )  # fmt: skip


def ready_replicas(view: ClusterView, model: str, *, besides: str | None = None) -> int:
    """READY replicas of ``model`` on active devices (other than ``besides``)."""
    return sum(1 for d in view.devices if d.active and d.name != besides and d.ready(model))


def share(view: ClusterView, model: str) -> float:
    """The fraction of one device that each replica of ``model`` is kept busy by:
    ``rate / (replicas * capacity)`` (replicas: READY or LOADING on active devices)."""
    replicas = max(1, len(view.hosts(model)))
    return view.rate_rps.get(model, 0.0) / (replicas * view.models[model].capacity_rps)


def argmin(items: Iterable[tuple[tuple[float | int | str, ...], list[Action]]]) -> list[Action]:
    """The actions of the smallest key (``[]`` when there are none)."""
    best: tuple[tuple[float | int | str, ...], list[Action]] | None = None
    for key, actions in items:
        if best is None or key < best[0]:
            best = (key, actions)
    return [] if best is None else best[1]
