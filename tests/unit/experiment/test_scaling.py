"""Time scale K: what is scaled, what is not, and that the arrivals are the same ones, K later."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import ClosedLoop, OpenLoop, TraceWorkload, default_load_times_s
from evenserve.experiment.load import scenario_arrivals
from evenserve.experiment.scaling import scale_scenario
from evenserve.sim.loader import load_scenario
from evenserve.workload import read_trace

from .scenarios import scenario, write


def test_open_loop_scaled(tmp_path: Path) -> None:
    loaded = load_scenario(write(tmp_path, scenario()))
    scaled = scale_scenario(loaded, 4.0, 40.0, 8.0, tmp_path)
    sc, sc0 = scaled.scenario, loaded.scenario
    assert (sc.duration_s, sc.warmup_s) == (40.0, 8.0)
    wl = sc.workload
    assert isinstance(wl, OpenLoop)
    assert wl.rates_rps == {"resnet50": 100.0, "bert-base": 15.0}
    assert [(p.start_s, p.end_s, p.multiplier) for p in wl.phases] == [(16.0, 24.0, 2.0)]
    st = wl.streams[0]
    assert (st.rate_rps, st.deadline_ms, st.priority) == (7.5, 200.0, "online")
    assert st.phases is not None and (st.phases[0].start_s, st.phases[0].end_s) == (4.0, 12.0)
    assert sc.models["resnet50"].slo_ms == 40.0 and sc.models["resnet50"].deadline_ms == 120.0
    assert sc.models["bert-base"].deadline_ms is None and sc.models["bert-base"].priority == 0
    # Policies, the signal period and the devices are left alone, but for placement's times.
    timed = {"placement_interval_ms", "load_wait_ms", "unload_ms"}
    for a, spec in sc.arms.items():
        assert spec.model_dump(exclude=timed) == sc0.arms[a].model_dump(exclude=timed)
    assert sc.signals == sc0.signals
    assert [d.model_dump(exclude={"start_ms"}) for d in sc.devices] == [
        d.model_dump(exclude={"start_ms"}) for d in sc0.devices
    ]
    p0 = loaded.profile_sets["a10"]["resnet50"]
    p1 = scaled.profile_sets["a10"]["resnet50"]
    assert p1.latency_ms == tuple(4.0 * x for x in p0.latency_ms)
    assert p1.batches == p0.batches and "time scale x4" in p1.source
    assert loaded.scenario.workload == sc0.workload  # the input is not changed


def test_the_scaled_arrivals_are_the_same_requests_k_times_later(tmp_path: Path) -> None:
    loaded = load_scenario(write(tmp_path, scenario()))
    k = 4.0
    scaled = scale_scenario(loaded, k, 40.0, 8.0, tmp_path)
    base = scenario_arrivals(loaded, 4)
    slow = scenario_arrivals(scaled, 4)
    # Rate / K draws gaps K times longer from the same seeded stream; phases move K later.
    assert len(slow) == len(base) > 1000
    for a, b in zip(base, slow, strict=True):
        assert (b.model, b.priority) == (a.model, a.priority)
        assert b.t_s == pytest.approx(k * a.t_s, rel=1e-9)
        if a.deadline_ms is None:
            assert b.deadline_ms is None
        else:
            assert b.deadline_ms == pytest.approx(k * a.deadline_ms)
    assert {a.deadline_ms for a in base} == {None, 30.0, 50.0}


def test_closed_loop_and_trace_scaled(tmp_path: Path) -> None:
    closed = {"type": "closed-loop", "users": 5, "think_ms": 8, "mix": {"resnet50": 1}}
    scaled = scale_scenario(
        load_scenario(write(tmp_path, scenario(workload=closed))), 10.0, 5.0, 1.0, tmp_path
    )
    wl = scaled.scenario.workload
    assert isinstance(wl, ClosedLoop) and wl.think_ms == 80.0 and wl.users == 5
    lines = [
        {"t_s": 0.5, "model": "resnet50", "priority": "offline", "deadline_ms": 9},
        {"t_s": 0.25, "model": "bert-base"},
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    trace = {"type": "trace", "path": "t.jsonl"}
    loaded = load_scenario(write(tmp_path, scenario(workload=trace)))
    work = tmp_path / "work"
    work.mkdir()
    scaled = scale_scenario(loaded, 3.0, 9.0, 0.0, work)
    wl = scaled.scenario.workload
    assert (
        isinstance(wl, TraceWorkload) and Path(wl.path) == (work / "trace-scaled.jsonl").resolve()
    )
    got = [(a.t_s, a.model, a.priority, a.deadline_ms) for a in read_trace(Path(wl.path))]
    # Times K later; a trace's own deadlines are as written (the models' are scaled).
    assert got == [(0.75, "bert-base", None, None), (1.5, "resnet50", 0, 9.0)]


@pytest.mark.parametrize(("duration_s", "warmup_s"), [(5.0, 5.0), (5.0, -1.0), (5.0, 6.0)])
def test_warmup_must_be_inside_the_run(tmp_path: Path, duration_s: float, warmup_s: float) -> None:
    loaded = load_scenario(write(tmp_path, scenario()))
    with pytest.raises(ConfigError, match="--warmup"):
        scale_scenario(loaded, 2.0, duration_s, warmup_s, tmp_path)


def test_placement_times_scale_alike(tmp_path: Path) -> None:
    """Load times (given, or the default from the weights made explicit), start times and
    placement intervals: all K times longer, as the batches are."""
    devices = [
        {"name": "g0", "models": ["resnet50", "bert-base"], "start_ms": 1500},
        {"name": "sp", "active": False, "start_ms": 2500},
    ]
    models = {
        "resnet50": {"slo_ms": 10, "load_ms": 300, "warm_load_ms": 40},
        "bert-base": {"slo_ms": 15},
    }
    arms = {
        "lru": {
            "routing": "least-expected-work",
            "batching": "fixed-window",
            "placement": {"policy": "lru"},
            "autoscaling": {"policy": "demand"},
            "placement_interval_ms": 500,
            "load_wait_ms": 2000,
        }
    }
    loaded = load_scenario(write(tmp_path, scenario(devices=devices, models=models, arms=arms)))
    k = 3.0
    sc = scale_scenario(loaded, k, 30.0, 3.0, tmp_path).scenario
    assert [d.start_ms for d in sc.devices] == [4500.0, 7500.0]
    arm = sc.arms["lru"]
    assert (arm.placement_interval_ms, arm.load_wait_ms, arm.unload_ms) == (1500.0, 6000.0, 30.0)
    r = sc.models["resnet50"]
    assert (r.load_ms, r.warm_load_ms) == pytest.approx((900.0, 120.0))
    weights = loaded.profile_sets["a10"]["bert-base"].weights_bytes
    cold, warm = default_load_times_s(weights)
    b = sc.models["bert-base"]
    assert (b.load_ms, b.warm_load_ms) == pytest.approx((cold * 1000 * k, warm * 1000 * k))
    # The simulator's own load times (what it plans and sleeps with) are the scaled ones.
    assert sc.models["bert-base"].load_times_s(weights) == pytest.approx((cold * k, warm * k))
