"""Autoscalers: timings of the demand autoscaler on hand-built views, and its properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evenserve.policy.placement import (
    AUTOSCALING,
    Autoscaler,
    ClusterView,
    DeviceView,
    ScaleDown,
    ScaleUp,
)
from evenserve.policy.placement.autoscale import (
    demand_devices,
    fits_elsewhere,
    homeless_bytes,
    memory_devices,
    replica_blocked,
    required_devices,
)

from .placement_helpers import device, model

MODELS = {m.name: m for m in (model("a", 2, cap_rps=10.0), model("b", 2, cap_rps=20.0))}


def build(spec: object) -> Autoscaler:
    scaler = AUTOSCALING.build(spec)
    assert isinstance(scaler, Autoscaler)
    return scaler


def fleet(active: int, total: int = 4, util: float = 0.0) -> list[DeviceView]:
    return [
        device(f"d{k}", 16, util=util if k < active else 0.0, active=k < active)
        for k in range(total)
    ]


def at(now_s: float, devices: list[DeviceView], rate: dict[str, float]) -> ClusterView:
    return ClusterView(now_s, MODELS, devices, rate)


def test_the_demand_formula() -> None:
    v = at(0.0, fleet(2, util=0.9), {"a": 5.0, "b": 10.0})  # 0.5 + 0.5 device from rates
    assert demand_devices(v) == pytest.approx(1.8)  # the devices report more: 2 x 0.9
    assert required_devices(v, 0.7, 1) == 3  # ceil(1.8 / 0.7)
    v = at(0.0, fleet(2), {"a": 7.0})
    assert required_devices(v, 0.7, 1) == 1  # 0.7 / 0.7 is one device exactly
    assert required_devices(at(0.0, fleet(2), {}), 0.7, 2) == 2  # min_devices


def test_none_never_changes_anything() -> None:
    assert build("none").decide(at(0.0, fleet(1), {"a": 1000.0})) == []


def test_a_burst_scales_up_after_up_after_s_inactive_devices_in_name_order() -> None:
    scaler = build("demand")  # up_after_s 1.0, target 0.7
    devices = fleet(1)
    assert scaler.decide(at(0.0, devices, {"a": 5.0})) == []  # 0.5 device: one is enough
    burst = {"a": 25.0}  # 2.5 devices / 0.7: 4 needed
    assert scaler.decide(at(10.0, devices, burst)) == []
    assert scaler.decide(at(10.25, devices, burst)) == []
    assert scaler.decide(at(10.75, devices, burst)) == []
    assert scaler.decide(at(11.0, devices, burst)) == [ScaleUp("d1"), ScaleUp("d2"), ScaleUp("d3")]
    assert scaler.decide(at(11.25, devices, burst)) == []  # asked already: not again
    devices[1].active = True  # d1 came up, the others are still starting
    assert scaler.decide(at(11.5, devices, burst)) == []


def test_a_blip_shorter_than_up_after_s_scales_nothing() -> None:
    scaler = build({"policy": "demand", "up_after_s": 1.0})
    devices = fleet(1)
    assert scaler.decide(at(0.0, devices, {"a": 25.0})) == []
    assert scaler.decide(at(0.5, devices, {"a": 1.0})) == []  # over: the clock restarts
    assert scaler.decide(at(0.9, devices, {"a": 25.0})) == []
    assert scaler.decide(at(1.5, devices, {"a": 25.0})) == []
    assert scaler.decide(at(1.9, devices, {"a": 25.0})) == [
        ScaleUp("d1"),
        ScaleUp("d2"),
        ScaleUp("d3"),
    ]


def test_only_the_devices_that_exist_are_asked_for() -> None:
    scaler = build({"policy": "demand", "up_after_s": 0})
    assert scaler.decide(at(0.0, fleet(1, total=2), {"a": 100.0})) == [ScaleUp("d1")]


def test_a_start_that_never_completes_is_asked_again_after_pending_s() -> None:
    scaler = build({"policy": "demand", "up_after_s": 0, "pending_s": 60})
    devices = fleet(1, total=2)
    assert scaler.decide(at(0.0, devices, {"a": 10.0})) == [ScaleUp("d1")]
    assert scaler.decide(at(59.0, devices, {"a": 10.0})) == []
    assert scaler.decide(at(60.0, devices, {"a": 10.0})) == [ScaleUp("d1")]


def test_scale_down_waits_for_quiet_s_and_goes_one_least_loaded_device_at_a_time() -> None:
    scaler = build("demand")  # quiet_s 30
    devices = fleet(3)
    devices[0].utilization, devices[1].utilization, devices[2].utilization = 0.2, 0.05, 0.1
    quiet = {"a": 2.0}  # 0.2 device: one is enough
    assert scaler.decide(at(0.0, devices, quiet)) == []
    assert scaler.decide(at(29.9, devices, quiet)) == []
    assert scaler.decide(at(30.0, devices, quiet)) == [ScaleDown("d1")]  # the least loaded
    assert scaler.decide(at(31.0, devices, quiet)) == []  # d1 is draining
    devices[1].active = False
    assert scaler.decide(at(32.0, devices, quiet)) == []  # the quiet clock starts again
    assert scaler.decide(at(61.9, devices, quiet)) == []
    assert scaler.decide(at(62.0, devices, quiet)) == [ScaleDown("d2")]


def test_a_busy_moment_restarts_the_quiet_clock() -> None:
    scaler = build({"policy": "demand", "quiet_s": 10})
    devices = fleet(2)
    assert scaler.decide(at(0.0, devices, {"a": 1.0})) == []
    assert scaler.decide(at(5.0, devices, {"a": 10.0})) == []  # 1 / 0.7: two needed now
    assert scaler.decide(at(6.0, devices, {"a": 1.0})) == []
    assert scaler.decide(at(15.0, devices, {"a": 1.0})) == []
    assert scaler.decide(at(16.0, devices, {"a": 1.0})) == [ScaleDown("d1")]  # ties: last name


def test_a_device_over_busy_utilization_is_not_quiet() -> None:
    # Three devices, demand for one: quiet, but d0 runs over busy_utilization (0.85) with
    # work placement has not spread yet; no device goes while it does, and the quiet
    # clock starts once it is below.
    scaler = build({"policy": "demand", "quiet_s": 10})
    devices = fleet(3)
    devices[0].utilization = 0.9
    assert scaler.decide(at(0.0, devices, {"a": 2.0})) == []
    assert scaler.decide(at(20.0, devices, {"a": 2.0})) == []
    devices[0].utilization = 0.5
    assert scaler.decide(at(21.0, devices, {"a": 2.0})) == []
    assert scaler.decide(at(31.0, devices, {"a": 2.0})) == [ScaleDown("d2")]


def test_never_below_min_devices() -> None:
    scaler = build({"policy": "demand", "min_devices": 2, "quiet_s": 0})
    devices = fleet(2)
    for t in range(0, 100, 10):
        assert scaler.decide(at(float(t), devices, {})) == []
    scaler = build({"policy": "demand", "min_devices": 2, "up_after_s": 0})
    assert scaler.decide(at(0.0, fleet(1), {})) == [ScaleUp("d1")]


@given(
    rates=st.lists(st.sampled_from([0.0, 1.0, 8.0, 20.0, 60.0]), min_size=1, max_size=40),
    dt=st.sampled_from([0.25, 1.0, 5.0]),
    min_devices=st.integers(0, 3),
    start=st.integers(1, 5),
    lag=st.integers(0, 3),
)
def test_decisions_are_consistent_over_random_demand(
    rates: list[float], dt: float, min_devices: int, start: int, lag: int
) -> None:
    """Scale-ups name inactive devices, scale-downs active ones, at most one down at a time,
    never below min_devices; and a sustained excess always gets a decision within up_after_s
    plus one interval. Devices take ``lag`` intervals to come up or go down."""
    scaler = build({"policy": "demand", "min_devices": min_devices, "quiet_s": 2.0})
    devices = fleet(start, total=5)
    changes: list[tuple[int, str, bool]] = []  # (step it takes effect, device, on)
    for i, rate in enumerate(rates):
        for _, name, on in [c for c in changes if c[0] == i]:
            next(d for d in devices if d.name == name).active = on
        view = at(i * dt, devices, {"a": rate})
        actions = scaler.decide(view)
        active = {d.name for d in devices if d.active}
        downs = [a for a in actions if isinstance(a, ScaleDown)]
        assert len(downs) <= 1 and (not downs or len(actions) == 1)
        for a in actions:
            assert (a.device in active) == isinstance(a, ScaleDown)
            changes.append((i + lag + 1, a.device, isinstance(a, ScaleUp)))
        ups_pending = sum(1 for w, _, on in changes if on and w > i)
        downs_pending = sum(1 for w, _, on in changes if not on and w > i)
        if downs:  # never below min_devices nor below what the demand needs
            intended = len(active) + ups_pending - downs_pending
            assert intended >= required_devices(view, 0.7, min_devices)


# -- memory pressure ---------------------------------------------------------------------

BIG = {m.name: m for m in (model(n, 6, cap_rps=1000.0) for n in ("m1", "m2", "m3", "m4"))}


def test_memory_pressure_scales_up_when_the_models_with_demand_cannot_all_be_resident() -> None:
    # Four 6 GiB models, each asked for, on devices of 16 GiB: compute wants one device (the
    # rates are tiny), memory wants ceil(24 / (0.9 * 16)) = 2.
    devices = [device("d0", 16, ["m1", "m2"]), device("d1", 16, active=False)]
    rates = {"m1": 1.0, "m2": 1.0, "m3": 1.0, "m4": 1.0}
    assert memory_devices(ClusterView(0.0, BIG, devices, rates), 0.9, 0.1) == 2
    scaler = build({"policy": "demand", "up_after_s": 0})
    assert scaler.decide(ClusterView(0.0, BIG, devices, rates)) == [ScaleUp("d1")]
    # the same models, two of them without demand (below idle_rps): 12 GiB fit in 14.4
    idle = {"m1": 1.0, "m2": 1.0, "m3": 0.05, "m4": 0.0}
    assert memory_devices(ClusterView(0.0, BIG, devices, idle), 0.9, 0.1) == 1
    assert (
        build({"policy": "demand", "up_after_s": 0}).decide(ClusterView(0.0, BIG, devices, idle))
        == []
    )


MIXED = {m.name: m for m in [model("L", 10), model("L2", 10)]} | {
    m.name: m for m in (model(f"s{k}", 3) for k in range(1, 6))
}


def test_scale_down_only_a_device_whose_residents_with_demand_fit_elsewhere() -> None:
    # 15 GiB devices; memory wants 2 (25 GiB of models with demand <= 2 x 0.9 x 15), compute
    # 1: one device may go. d2 is the least loaded, but its L (10 GiB, no other replica)
    # fits in neither d0's 6 nor d1's 9 free GiB: d1 goes instead (s4, s5 fit in d0).
    d0 = device("d0", 15, ["s1", "s2", "s3"], util=0.3)
    d1 = device("d1", 15, ["s4", "s5"], util=0.2)
    d2 = device("d2", 15, ["L"], util=0.1)
    rates = dict.fromkeys(["L", "s1", "s2", "s3", "s4", "s5"], 1.0)
    v = ClusterView(0.0, MIXED, [d0, d1, d2], rates)
    assert not fits_elsewhere(v, d2, [d0, d1], 0.1)
    assert fits_elsewhere(v, d1, [d0, d2], 0.1)
    assert build({"policy": "demand", "quiet_s": 0}).decide(v) == [ScaleDown("d1")]
    # L without demand need not fit anywhere: d2, the least loaded, goes
    idle_l = ClusterView(0.0, MIXED, [d0, d1, d2], rates | {"L": 0.0})
    assert build({"policy": "demand", "quiet_s": 0}).decide(idle_l) == [ScaleDown("d2")]


def test_no_scale_down_when_no_device_can_be_emptied() -> None:
    # d0's three 3 GiB models do not fit in d1's and d2's 5 free GiB each (first fit by
    # size); neither L nor L2 fits anywhere: nothing goes, though memory and compute allow.
    d0 = device("d0", 15, ["s1", "s2", "s3"], util=0.3)
    d1 = device("d1", 15, ["L2"], util=0.2)
    d2 = device("d2", 15, ["L"], util=0.1)
    rates = dict.fromkeys(["L", "L2", "s1", "s2", "s3"], 1.0)
    v = ClusterView(0.0, MIXED, [d0, d1, d2], rates)
    scaler = build({"policy": "demand", "quiet_s": 0, "fill_target": 1.0})
    assert memory_devices(v, 1.0, 0.1) == 2  # 29 GiB in 30
    assert scaler.decide(v) == []
    # with d2's L gone idle, d2 empties: it goes
    rates["L"] = 0.0
    assert scaler.decide(v) == [ScaleDown("d2")]


def test_one_more_device_when_a_busy_devices_model_has_nowhere_to_get_a_replica() -> None:
    # d0 is over busy_utilization (0.85); a (2 GiB) could get a replica on d1 only if d1
    # had 2 GiB free. Compute (1.0 busy / 0.7: 2 devices) and memory (1 device) are met.
    d0 = device("d0", 16, ["a"], util=0.9)
    d1 = device("d1", 2, ["b"], util=0.1)
    d2 = device("d2", 16, active=False)
    rates = {"a": 5.0, "b": 1.0}
    scaler = build({"policy": "demand", "up_after_s": 0})
    v = ClusterView(0.0, MODELS, [d0, d1, d2], rates)
    assert replica_blocked(v, 0.85, 0.7)
    assert scaler.decide(v) == [ScaleUp("d2")]
    roomy = ClusterView(0.0, MODELS, [d0, device("d1", 16, ["b"], util=0.1), d2], rates)
    assert not replica_blocked(roomy, 0.85, 0.7)
    assert build({"policy": "demand", "up_after_s": 0}).decide(roomy) == []


def test_scale_down_prefers_a_device_whose_models_all_have_a_copy_elsewhere() -> None:
    # d2 is the least loaded, but turning it off makes s4 miss; d1's s1 and s2 are on d0
    # too: d1 goes, and nothing misses.
    d0 = device("d0", 15, ["s1", "s2", "s3"], util=0.3)
    d1 = device("d1", 15, ["s1", "s2"], util=0.2)
    d2 = device("d2", 15, ["s4"], util=0.1)
    rates = dict.fromkeys(["s1", "s2", "s3", "s4"], 1.0)
    v = ClusterView(0.0, MIXED, [d0, d1, d2], rates)
    assert homeless_bytes(v, d1, [d0, d1, d2], 0.1) == 0
    assert homeless_bytes(v, d2, [d0, d1, d2], 0.1) == 3 * 2**30
    assert build({"policy": "demand", "quiet_s": 0}).decide(v) == [ScaleDown("d1")]
