"""The burst clock: how long the autoscaler took to decide a ScaleUp after the over-demand.

One definition for the gateway (its scale-up decision-time gauge) and the simulator
(``RunRecords.scale_up_decisions_s``): the clock starts at the first arrival of the interval
(between two ticks) at whose tick the compute-demand estimate (``demand_devices`` /
``target_utilization``, on the autoscaler's view) first exceeds the active and starting
devices, and stops at the ScaleUp (or when the demand falls back). It leaves out the
estimate's rise and sees no memory-pressure or blocked-replica ScaleUp; the figure to judge
a scale-up by is the time from the burst's start (``experiment.placement_figures.
scale_up_after_burst_s``). Sans I/O: the caller passes the times.
"""

from __future__ import annotations

from dataclasses import dataclass

from evenserve.policy.placement.autoscale import demand_devices
from evenserve.policy.placement.controller import PlacementController


@dataclass
class BurstClock:
    first_arrival_s: float | None = None
    burst_start_s: float | None = None

    def arrival(self, now: float) -> None:
        """A request arrived (any catalogue model)."""
        if self.first_arrival_s is None:
            self.first_arrival_s = now

    def tick(self, ctl: PlacementController, now: float) -> None:
        """Before the controller's tick: start (or stop) the clock on its demand estimate."""
        first, self.first_arrival_s = self.first_arrival_s, None
        if ctl.autoscaler is None:
            return
        view = ctl.scale_view(now)
        active = sum(1 for d in view.devices if d.active) + len(ctl.starting)
        params = getattr(ctl.autoscaler, "params", None)
        target = float(getattr(params, "target_utilization", 1.0))
        over = demand_devices(view) / target > active
        if not over:
            self.burst_start_s = None
        elif self.burst_start_s is None:
            self.burst_start_s = first if first is not None else now

    def scale_up(self, now: float) -> float | None:
        """A ScaleUp was decided: seconds since the burst began (None: no burst running)."""
        start, self.burst_start_s = self.burst_start_s, None
        return None if start is None else now - start
