"""What the live placement shows: its counters, as Prometheus metrics (``PlacementCollector``)
and in the admin view (``GET /admin/placement``, ``placement_view``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from evenserve.cluster.gateway_section import PlacementSettings
from evenserve.gateway.device_scaling import DeviceScaling
from evenserve.gateway.model_operations import ModelOperations
from evenserve.gateway.placement_counters import PlacementCounters
from evenserve.metrics import names
from evenserve.policy.placement.autoscale import demand_devices
from evenserve.policy.placement.controller import PlacementController


class PlacementCollector(Collector):
    """The counters as Prometheus families, with each device's active seconds."""

    def __init__(
        self, counters: PlacementCounters, active_seconds: Callable[[], dict[str, float]]
    ) -> None:
        self.counters = counters
        self.active_seconds = active_seconds

    def collect(self) -> Iterator[Metric]:
        d = self.counters
        for name, text, counts in (
            (names.GATEWAY_MODEL_LOADS, "model loads the gateway started", d.loads),
            (names.GATEWAY_EVICTIONS, "model unloads the gateway started", d.evictions),
            (
                names.GATEWAY_PLACEMENT_ADOPTED,
                "models placement adopted from a backend's index (loaded by hand, a restart)",
                d.adopted,
            ),
            (
                names.GATEWAY_PLACEMENT_DROPPED,
                "models placement counted READY that a backend's index no longer had",
                d.dropped,
            ),
        ):
            family = CounterMetricFamily(name, text, labels=["backend", "model"])
            for (b, m), n in sorted(counts.items()):
                family.add_metric([b, m], n)
            yield family
        act = CounterMetricFamily(
            names.GATEWAY_DEVICE_ACTIVE_SECONDS,
            "seconds each device was on (device-seconds: the cost)",
            labels=["backend"],
        )
        for b, s in sorted(self.active_seconds().items()):
            act.add_metric([b], s)
        yield act
        lost = CounterMetricFamily(
            names.GATEWAY_DEVICES_LOST,
            "times a device on was lost (ejected, not turned off by the autoscaler)",
            labels=["backend"],
        )
        for b, n in sorted(d.lost.items()):
            lost.add_metric([b], n)
        yield lost
        sc = CounterMetricFamily(
            names.GATEWAY_SCALE_DECISIONS, "autoscaler decisions", labels=["direction"]
        )
        for direction, n in sorted(d.scale_decisions.items()):
            sc.add_metric([direction], n)
        yield sc
        up = GaugeMetricFamily(
            names.GATEWAY_SCALE_UP_DECISION_SECONDS,
            "seconds from the first request of the interval whose demand estimate first "
            "exceeded the devices to the ScaleUp decision (the last one)",
        )
        up.add_metric([], math.nan if d.last_scale_up_s is None else d.last_scale_up_s)
        yield up

    def describe(self) -> Iterator[Metric]:
        return iter(())


def placement_view(
    ctl: PlacementController,
    settings: PlacementSettings,
    counters: PlacementCounters,
    scaling: DeviceScaling,
    ops: ModelOperations,
    now: float,
    scale_requests: Callable[[], list[dict[str, str]]],
    wall_offset_s: float = 0.0,
) -> dict[str, Any]:
    """``GET /admin/placement``: the settings, each device, the counts, what is pending
    (loads waiting, operations under way, ``scale_requests()``), the demand, the ScaleUp
    times, every decision the controller took (``decisions``: ``[unix time, source, kind,
    model, device, rate_rps, utilization]``, oldest first) and every change of a model's
    residency on a device (``switches``: ``[unix time, model, device, kind]``, what the
    anti-thrash rule counts), and the controller's clock (``clock``: when its estimates
    started, its next rebalance and autoscaler check); ``wall_offset_s`` is the wall clock
    less the controller's."""
    c = ctl.counts
    active_s = scaling.active_seconds(now)
    return {
        "policy": settings.policy,
        "autoscaling": None if ctl.autoscaler is None else type(ctl.autoscaler).__name__,
        "interval_ms": settings.interval_ms,
        "load_wait_ms": settings.load_wait_ms,
        "devices": {
            name: {
                "active": d.active,
                "starting": name in ctl.starting,
                "lost": name in ctl.lost,
                "scale": scaling.books[name].scale,
                "residents": dict(sorted(d.models.items())),
                "outstanding": dict(sorted(d.outstanding.items())),
                "utilization": d.utilization,
                "memory_total_bytes": d.memory_total_bytes,
                "memory_used_bytes": d.used_bytes(ctl.models),
                "active_seconds": round(active_s[name], 6),
            }
            for name, d in ctl.devices.items()
        },
        "lost": sorted(ctl.lost),
        "counts": {
            "loads": c.loads,
            "cold_loads": c.cold_loads,
            "warm_loads": c.warm_loads,
            # What the workers' load replies said (the controller plans, they measure).
            "live_warm_loads": counters.live_sources["host"],
            "live_cold_loads": counters.live_sources["disk"],
            "evictions": c.evictions,
            "scale_ups": c.scale_ups,
            "scale_downs": c.scale_downs,
            "unplaced": c.unplaced,
            "lost": c.lost,
            "adopted": c.adopted,
            "dropped": c.dropped,
        },
        "pending": {
            "loads_waiting": sorted(f"{m}@{d}" for (m, d) in ops.waiters),
            "operations": len(ops.tasks),
            "scale": scale_requests(),
        },
        "demand_rps": {m: round(ctl.rate_rps(m, now), 6) for m in sorted(ctl.models)},
        "demand_devices": round(demand_devices(ctl.view(now)), 6),
        "warm": ctl.warm,
        "scale_up_decision_s": counters.last_scale_up_s,
        "scale_up_decisions_s": list(counters.scale_up_log),
        "scale_ups_unix_s": list(counters.scale_up_unix_s),
        "decisions": [
            [
                round(d.t_s + wall_offset_s, 6),
                d.source,
                d.kind,
                d.model,
                d.device,
                round(d.rate_rps, 6),
                round(d.utilization, 6),
            ]
            for d in c.decisions
        ],
        "switches": [[round(t + wall_offset_s, 6), m, dev, k] for t, m, dev, k in c.switch_log],
        # The controller's clock in wall time: when its demand estimates started, when its
        # next rebalance and autoscaler check are due (None: not yet scheduled).
        "clock": {
            "started_unix_s": None
            if ctl.started_s is None
            else round(ctl.started_s + wall_offset_s, 6),
            "next_rebalance_unix_s": _wall(ctl.next_rebalance_s, wall_offset_s),
            "next_scale_unix_s": _wall(ctl.next_scale_s, wall_offset_s)
            if ctl.autoscaler is not None
            else None,
            "interval_s": ctl.interval_s,
            "scale_interval_s": ctl.scale_interval_s,
        },
    }


def _wall(due_s: float, offset_s: float) -> float | None:
    return None if due_s <= 0.0 else round(due_s + offset_s, 6)
