"""Scale-up decision time: a step in the offered load gets a ScaleUp within 2 s of the step,
a blip shorter than ``up_after_s`` gets none (the controller's fast-rising demand and its
quarter-interval scale checks; times injected)."""

from __future__ import annotations

import pytest

from evenserve.policy.placement import (
    AUTOSCALING,
    PLACEMENT,
    READY,
    DeviceView,
    ModelInfo,
    ScaleAction,
    ScaleUp,
)
from evenserve.policy.placement.autoscale import demand_devices
from evenserve.policy.placement.controller import PlacementController

GIB = 2.0**30
#: One replica of "a" serves 100 req/s; at target 0.7 one device holds 70 req/s of it.
CAP_RPS = 100.0
BASE_RPS = 30.0


def controller() -> PlacementController:
    info = {"a": ModelInfo("a", 1 * GIB, 1.0, 0.1, batch_s=1.0 / CAP_RPS, max_batch_size=1)}
    devices = [DeviceView("d0", 8 * GIB, {"a": READY}), DeviceView("s0", 8 * GIB, active=False)]
    return PlacementController(
        info,
        devices,
        PLACEMENT.build("cost-aware"),
        AUTOSCALING.build({"policy": "demand", "target_utilization": 0.7}),  # up_after_s 1
        interval_s=1.0,
    )


def run(c: PlacementController, rate_at: object, end_s: float) -> list[tuple[float, ScaleAction]]:
    """Arrivals evenly spaced at ``rate_at(t)`` req/s from 0 to ``end_s``, the controller
    ticked every ``tick_s``; the scale actions with their times."""
    assert callable(rate_at)
    out: list[tuple[float, ScaleAction]] = []
    t, next_tick = 0.0, c.tick_s
    while t < end_s:
        while next_tick <= t:
            for a in c.tick(next_tick):
                if isinstance(a, ScaleUp):
                    out.append((next_tick, a))
            next_tick += c.tick_s
        c.arrival("a", t)
        t += 1.0 / float(rate_at(t))
    return out


def test_the_scale_checks_run_four_times_per_placement_interval() -> None:
    c = controller()
    assert c.tick_s == pytest.approx(0.25)
    assert c.scale_interval_s == pytest.approx(0.25)


def test_a_step_burst_gets_a_scale_up_within_2_s_of_the_step() -> None:
    step_s = 60.0  # the long (10 s) estimate has settled at 30 req/s by then

    def rate(t: float) -> float:
        return BASE_RPS * (3.0 if t >= step_s else 1.0)

    c = controller()
    ups = run(c, rate, step_s + 5.0)
    assert [a for _, a in ups] == [ScaleUp("s0")]
    took = ups[0][0] - step_s
    assert 0.0 < took <= 2.0
    # The 10 s estimate alone would still read under a device's 70 req/s at the decision
    # (it needs 10 x ln 3 = 11 s): the fast-rising demand is what decided.
    assert c.rate_rps("a", ups[0][0]) < 0.7 * CAP_RPS
    assert c.burst_rate_rps("a", ups[0][0]) > 0.7 * CAP_RPS


def test_a_blip_shorter_than_up_after_s_gets_no_scale_up() -> None:
    start_s, blip_s = 60.0, 0.5  # 5x for 0.5 s: the demand is over one device for < 1 s

    def rate(t: float) -> float:
        return BASE_RPS * (5.0 if start_s <= t < start_s + blip_s else 1.0)

    c = controller()
    assert run(c, rate, start_s) == []
    over = False
    t = start_s
    ups: list[ScaleAction] = []
    while t < start_s + 10.0:
        c.arrival("a", t)
        if demand_devices(c.scale_view(t)) / 0.7 > 1.0:
            over = True  # the signal did see it ...
        ups += [a for a in c.tick(t) if isinstance(a, ScaleUp)]
        t += 1.0 / rate(t)
    assert over
    assert ups == []  # ... but not for up_after_s


def test_the_fast_demand_falls_no_faster_than_the_long_one() -> None:
    c = controller()
    for k in range(900):  # 90 req/s for 10 s
        c.arrival("a", k / 90.0)
    for t in (10.5, 12.0, 20.0, 40.0):
        assert c.burst_rate_rps("a", t) >= c.rate_rps("a", t) > 0.0
    # 10 s after the last arrival the 0.5 s estimate is gone: the long one is the demand.
    assert c.burst_rate_rps("a", 20.0) == c.rate_rps("a", 20.0)
