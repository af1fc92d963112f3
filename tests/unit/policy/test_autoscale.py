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
from evenserve.policy.placement.autoscale import demand_devices, required_devices

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
    scaler = build("demand")  # up_after_s 0.5, target 0.7
    devices = fleet(1)
    assert scaler.decide(at(0.0, devices, {"a": 5.0})) == []  # 0.5 device: one is enough
    burst = {"a": 25.0}  # 2.5 devices / 0.7: 4 needed
    assert scaler.decide(at(10.0, devices, burst)) == []
    assert scaler.decide(at(10.25, devices, burst)) == []
    assert scaler.decide(at(10.5, devices, burst)) == [ScaleUp("d1"), ScaleUp("d2"), ScaleUp("d3")]
    assert scaler.decide(at(10.75, devices, burst)) == []  # asked already: not again
    devices[1].active = True  # d1 came up, the others are still starting
    assert scaler.decide(at(11.0, devices, burst)) == []


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
