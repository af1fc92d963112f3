"""The simulator with placement: loads take their time, evictions make room, devices come and
go, memory stays within each device, and every request is answered once."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.placement_policies  # noqa: F401  (registers the test policies)
from evenserve.core.errors import ConfigError
from evenserve.core.results import RunRecords
from evenserve.core.wire import LOAD_TIMEOUT, NO_BACKEND
from evenserve.report.summary import summarize
from evenserve.sim.cluster import Simulation, simulate
from evenserve.sim.loader import parse_scenario

from .scenarios import toy_scenario

GIB = 1024.0**3


def profiles(root: Path, weights_mb: dict[str, float]) -> None:
    d = root / "profiles" / "p"
    d.mkdir(parents=True, exist_ok=True)
    for m, w in weights_mb.items():
        doc = {
            "model": m,
            "device": "toy",
            "runtime": "test",
            "precision": "fp16",
            "source": "hand-written for tests",
            "weights_mb": w,
            "points": [{"batch": 1, "latency_ms": 5.0}, {"batch": 8, "latency_ms": 12.0}],
        }
        (d / f"{m}.yaml").write_text(yaml.safe_dump(doc))


def scenario(
    root: Path,
    *,
    weights_mb: dict[str, float] | None = None,
    devices: list[dict[str, Any]] | None = None,
    trace: list[tuple[float, str]] | None = None,
    rates: dict[str, float] | None = None,
    arm: dict[str, Any] | None = None,
    models: dict[str, dict[str, Any]] | None = None,
    duration_s: float = 10.0,
    seed: int = 1,
) -> Simulation:
    weights_mb = weights_mb or {"a": 1024, "b": 1024, "c": 1024}
    profiles(root, weights_mb)
    if trace is not None:
        (root / "trace.jsonl").write_text(
            "".join(json.dumps({"t_s": t, "model": m}) + "\n" for t, m in trace)
        )
        wl: dict[str, Any] = {"type": "trace", "path": "trace.jsonl"}
    else:
        wl = {"type": "open-loop", "rates_rps": rates or {"a": 50}}
    raw = {
        "name": "placement",
        "seed": seed,
        "duration_s": duration_s,
        "profile_sets": {"p": "profiles/p"},
        "devices": devices or [{"name": "d0", "memory_gb": 2, "models": ["a"]}],
        "models": {m: {"slo_ms": 1000, **(models or {}).get(m, {})} for m in weights_mb},
        "workload": wl,
        "arms": {
            "placed": {
                "routing": "least-connections",
                "batching": {
                    "policy": "fixed-window",
                    "max_batch_size": 8,
                    "max_batch_delay_ms": 1,
                },
                "placement": "test-fit-or-evict",
                **(arm or {}),
            }
        },
    }
    return Simulation(parse_scenario(raw, root), "placed")


def answered_once(rec: RunRecords, sim: Simulation) -> None:
    """Every request is completed or dropped with a reason, never both; the ones still out at
    the end are exactly the controller's outstanding count."""
    log = rec.requests
    out = 0
    for fin, reason in zip(log.finish_s, log.drop_reason, strict=True):
        done = not math.isnan(fin)
        assert not (done and reason is not None)
        out += not done and reason is None
    assert sim.placement is not None
    ctl = sim.placement.controller
    assert out == sum(n for d in ctl.devices.values() for n in d.outstanding.values())


def test_a_cold_models_first_request_waits_its_load_time(tmp_path: Path) -> None:
    sim = scenario(
        tmp_path,
        trace=[(1.0, "a"), (2.0, "b"), (2.1, "b"), (4.0, "b")],
        models={"b": {"load_ms": 500}},
    )
    rec = sim.run()
    log = rec.requests
    assert log.drop_reason == [None] * 4
    # b was not resident: the first waits the whole load, the second what was left of it.
    assert log.load_wait_s == {1: pytest.approx(0.5), 2: pytest.approx(0.4)}
    # Both in one batch after the load: 6 ms for two (5 ms at 1, 12 ms at 8, linear).
    assert log.finish_s[1] == log.finish_s[2] == pytest.approx(2.5 + 0.006)
    assert log.finish_s[3] == pytest.approx(4.006)  # resident now: the 1 ms window, 5 ms
    assert rec.loads == 1 and rec.evictions == 0
    assert rec.device_seconds == pytest.approx(10.0)
    answered_once(rec, sim)


def test_default_load_times_follow_the_weights(tmp_path: Path) -> None:
    sim = scenario(tmp_path, trace=[(1.0, "b")])
    rec = sim.run()
    # 1 GiB cold: 2**30 / 2e9 s + 50 ms.
    assert rec.requests.load_wait_s[0] == pytest.approx(2**30 / 2e9 + 0.050)


def test_a_request_waiting_past_the_bound_is_dropped_as_load_timeout(tmp_path: Path) -> None:
    sim = scenario(
        tmp_path,
        trace=[(1.0, "b"), (2.2, "b")],
        models={"b": {"load_ms": 2000}},
        arm={"load_wait_ms": 1000},
    )
    rec = sim.run()
    log = rec.requests
    assert log.drop_reason == [LOAD_TIMEOUT, None]
    assert log.load_wait_s == {0: pytest.approx(1.0), 1: pytest.approx(0.8)}
    s = summarize(rec)
    assert s["requests"]["dropped_by_reason"] == {LOAD_TIMEOUT: 1}
    answered_once(rec, sim)


def test_evictions_make_room_and_are_counted(tmp_path: Path) -> None:
    # 2 GiB hold two of the three 1 GiB models: each switch evicts the least recently used.
    trace = [(1.0 + k, m) for k, m in enumerate(["b", "c", "a", "b", "a"])]
    sim = scenario(
        tmp_path,
        devices=[{"name": "d0", "memory_gb": 2, "models": ["a"]}],
        trace=trace,
        models={m: {"load_ms": 200} for m in "abc"},
    )
    rec = sim.run()
    assert rec.requests.drop_reason == [None] * 5
    # b loads into free room; c evicts a; a evicts b; b evicts c; a is resident.
    assert rec.loads == 4 and rec.evictions == 3
    assert rec.requests.load_wait_s.keys() == {0, 1, 2, 3}
    assert rec.requests.load_wait_s[1] == pytest.approx(0.2 + 0.010)  # the unload first
    s = summarize(rec)
    assert s["loads"] == 4 and s["evictions"] == 3
    assert s["load_wait"]["requests"] == 4
    assert s["load_wait"]["max_ms"] == pytest.approx(210.0)
    answered_once(rec, sim)


def test_a_model_that_cannot_be_placed_is_refused_as_no_backend(tmp_path: Path) -> None:
    sim = scenario(
        tmp_path,
        weights_mb={"a": 1024, "big": 4096},
        trace=[(1.0, "big")],
    )
    rec = sim.run()
    assert rec.requests.drop_reason == [NO_BACKEND]
    assert sim.placement is not None and sim.placement.controller.counts.unplaced == 1


def test_device_seconds_follow_devices_turned_on_and_off(tmp_path: Path) -> None:
    sim = scenario(
        tmp_path,
        devices=[
            {"name": "d0", "memory_gb": 2, "models": ["a"]},
            {"name": "s0", "memory_gb": 2, "active": False, "start_ms": 500},
        ],
        rates={"a": 20},
        arm={
            "autoscaling": {
                "policy": "test-scheduled",
                "up": ["s0"],
                "up_at_s": 2.0,
                "down": ["s0"],
                "down_at_s": 6.0,
            }
        },
    )
    rec = sim.run()
    by = {d.name: d.active_s for d in rec.devices}
    assert by["d0"] == pytest.approx(10.0)
    assert by["s0"] == pytest.approx(4.0)  # on at 2 s (ready at 2.5 s), off at 6 s: idle
    assert rec.device_seconds == pytest.approx(14.0)
    assert summarize(rec)["device_seconds"] == pytest.approx(14.0)
    answered_once(rec, sim)


def test_a_device_turned_on_takes_misses_and_drains_before_it_stops(tmp_path: Path) -> None:
    # b (1.5 GiB) fits only on the spare s0 (2 GiB), on from 1 s (ready at 1.5 s) to 5 s.
    trace = [(3.0 + 0.01 * k, "b") for k in range(300)]
    sim = scenario(
        tmp_path,
        weights_mb={"a": 1024, "b": 1536},
        devices=[
            {"name": "d0", "memory_gb": 1, "models": ["a"]},
            {"name": "s0", "memory_gb": 2, "active": False, "start_ms": 500},
        ],
        trace=trace,
        models={"b": {"load_ms": 100}},
        arm={
            "autoscaling": {
                "policy": "test-scheduled",
                "up": ["s0"],
                "up_at_s": 1.0,
                "down": ["s0"],
                "down_at_s": 5.0,
            }
        },
    )
    rec = sim.run()
    log = rec.requests
    before = [i for i, t in enumerate(log.arrival_s) if t < 4.999]
    after = [i for i, t in enumerate(log.arrival_s) if t > 5.001]
    assert all(log.drop_reason[i] is None and log.device[i] == "s0" for i in before)
    assert log.load_wait_s[0] == pytest.approx(0.1)  # the first waited for the cold load
    assert all(log.drop_reason[i] == NO_BACKEND for i in after)  # s0 is going: no room
    by = {d.name: d.active_s for d in rec.devices}
    assert by["s0"] == pytest.approx(4.0, abs=0.05)  # it drained what it had, then stopped
    answered_once(rec, sim)


def test_without_placement_every_device_is_on_the_whole_run(tmp_path: Path) -> None:
    raw = toy_scenario(tmp_path)
    loaded = parse_scenario(raw, tmp_path)
    rec = simulate(loaded, "baseline")
    assert rec.device_seconds == pytest.approx(3 * 20.0)
    assert rec.evictions == 0 and rec.loads == 0 and rec.requests.load_wait_s == {}
    s = summarize(rec)
    assert s["device_seconds"] == pytest.approx(60.0) and s["evictions"] == 0
    assert s["load_wait"] == {"requests": 0, "mean_ms": None, "p99_ms": None, "max_ms": None}


def test_an_initial_placement_over_memory_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"devices\[0\]\.models: weights 3\.00 GiB over"):
        scenario(tmp_path, devices=[{"name": "d0", "memory_gb": 2, "models": ["a", "b", "c"]}])


def test_placement_options_are_checked_on_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"arms\.placed\.placement"):
        scenario(tmp_path, arm={"placement": "no-such-policy"})
    with pytest.raises(ConfigError, match=r"arms\.placed\.autoscaling"):
        scenario(tmp_path, arm={"autoscaling": "no-such-autoscaler"})
    with pytest.raises(ConfigError, match="models: a device that is not active starts with none"):
        scenario(tmp_path, devices=[{"name": "d0", "active": False, "models": ["a"]}])
    with pytest.raises(ConfigError, match=r"arms\.placed\.devices\[0\]: unknown device 'x'"):
        scenario(tmp_path, arm={"devices": ["x"]})


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    weights=st.lists(st.integers(200, 1500), min_size=2, max_size=5),
    memory_gb=st.sampled_from([1.5, 2.0, 3.0]),
    rates=st.lists(st.floats(0.5, 40.0), min_size=5, max_size=5),
    load_ms=st.integers(0, 800),
    wait_ms=st.integers(100, 2000),
    spare=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_memory_stays_within_every_device_and_each_request_is_answered_once(
    tmp_path_factory: pytest.TempPathFactory,
    weights: list[int],
    memory_gb: float,
    rates: list[float],
    load_ms: int,
    wait_ms: int,
    spare: bool,
    seed: int,
) -> None:
    root = tmp_path_factory.mktemp("prop")
    names = [f"m{k}" for k in range(len(weights))]
    devices: list[dict[str, Any]] = [
        {"name": "d0", "memory_gb": memory_gb, "models": []},
        {"name": "d1", "memory_gb": memory_gb, "models": []},
    ]
    auto: dict[str, Any] = {}
    if spare:
        devices.append({"name": "s0", "memory_gb": memory_gb, "active": False, "start_ms": 300})
        auto = {
            "autoscaling": {
                "policy": "test-scheduled",
                "up": ["s0"],
                "up_at_s": 1.0,
                "down": ["s0", "d1"],
                "down_at_s": 3.0,
            }
        }
    sim = scenario(
        root,
        weights_mb=dict(zip(names, weights, strict=True)),
        devices=devices,
        rates={m: rates[k] for k, m in enumerate(names)},
        models={m: {"load_ms": load_ms} for m in names},
        arm={"load_wait_ms": wait_ms, "host_memory_gb": 1, **auto},
        duration_s=5.0,
        seed=seed,
    )
    rec = sim.run()  # asserts at every load start that the weights fit
    assert sim.placement is not None
    for pd in sim.placement.devices.values():
        assert pd.peak_weights_bytes <= pd.spec.memory_gb * GIB
    answered_once(rec, sim)
    assert rec.device_seconds is not None and rec.device_seconds <= 5.0 * len(devices)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    policy=st.sampled_from(["lru", "cost-aware"]),
    weights=st.lists(st.integers(200, 1500), min_size=3, max_size=6),
    memory_gb=st.sampled_from([1.5, 2.0, 3.0]),
    rates=st.lists(st.floats(0.5, 300.0), min_size=6, max_size=6),
    load_ms=st.integers(0, 800),
    seed=st.integers(0, 1000),
)
def test_the_real_policies_with_demand_autoscaling_keep_memory_and_answer_once(
    tmp_path_factory: pytest.TempPathFactory,
    policy: str,
    weights: list[int],
    memory_gb: float,
    rates: list[float],
    load_ms: int,
    seed: int,
) -> None:
    """lru or cost-aware with `demand` (memory pressure included) and two spares: every load
    fits its device (asserted by the driver at each start), every action list passes
    check_actions (no model both loaded and unloaded on one device: a run raises otherwise),
    and every request is answered once."""
    root = tmp_path_factory.mktemp("real")
    names = [f"m{k}" for k in range(len(weights))]
    devices: list[dict[str, Any]] = [
        {"name": "d0", "memory_gb": memory_gb, "models": []},
        {"name": "d1", "memory_gb": memory_gb, "models": []},
        {"name": "s", "count": 2, "memory_gb": memory_gb, "active": False, "start_ms": 300},
    ]
    sim = scenario(
        root,
        weights_mb=dict(zip(names, weights, strict=True)),
        devices=devices,
        rates={m: rates[k] for k, m in enumerate(names)},
        models={m: {"load_ms": load_ms} for m in names},
        arm={
            "placement": {"policy": policy},
            "autoscaling": {"policy": "demand", "quiet_s": 0.5, "up_after_s": 0},
            "load_wait_ms": 2000,
            "host_memory_gb": 1,
            "placement_interval_ms": 250,
        },
        duration_s=5.0,
        seed=seed,
    )
    rec = sim.run()
    assert sim.placement is not None
    for pd in sim.placement.devices.values():
        assert pd.peak_weights_bytes <= pd.spec.memory_gb * GIB
    answered_once(rec, sim)
    assert rec.device_seconds is not None and rec.device_seconds <= 5.0 * 4


@pytest.mark.parametrize("window_s", [0.0, 3.0])
def test_the_anti_thrash_window_spaces_each_models_switches_on_a_device(
    tmp_path: Path, window_s: float
) -> None:
    """Two models taking turns every half second on a device that holds one of them (lru
    evicts the other at every miss): without the window they switch at every turn; with
    ``min_switch_s`` 3 no (model, device) changes twice within 3 s (the misses in between
    are refused: 503, never a thrash)."""
    trace = [(0.25 + 0.5 * k, "a" if k % 2 == 0 else "b") for k in range(18)]
    sim = scenario(
        tmp_path,
        weights_mb={"a": 1024, "b": 1024},
        devices=[{"name": "d0", "memory_gb": 1.5, "models": []}],
        trace=trace,
        arm={"placement": {"policy": "lru", "hold_s": 0}, "min_switch_s": window_s},
        duration_s=10.0,
    )
    rec = sim.run()
    assert sim.placement is not None
    log = sim.placement.controller.counts.switch_log
    last: dict[tuple[str, str], float] = {}
    gaps = []
    for t, m, d, _ in log:
        if (m, d) in last:
            gaps.append(t - last[(m, d)])
        last[(m, d)] = t
    assert gaps
    if window_s:
        assert min(gaps) >= window_s
        assert sum(1 for r in rec.requests.drop_reason if r == "no-backend") > 0
    else:
        assert min(gaps) < 3.0
