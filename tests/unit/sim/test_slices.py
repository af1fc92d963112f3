"""Scenario devices that are MIG slices or time-sliced shares: their speed and memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from evenserve.core.errors import ConfigError
from evenserve.sim.cluster import Simulation, simulate
from evenserve.sim.loader import load_scenario
from tests.unit.sim.scenarios import toy_scenario, write_scenario

GIB = 1024.0**3


def _load(tmp_path: Path, slice_: str | None, trace: list[str] | None = None):  # type: ignore[no-untyped-def]
    dev: dict[str, object] = {"name": "d0", "models": ["fast", "slow"], "memory_gb": 40}
    if slice_ is not None:
        dev["slice"] = slice_
    over: dict[str, object] = {
        "duration_s": 3,
        "warmup_s": 0,
        "devices": [dev],
        "arms": {"one": {"routing": "round-robin", "batching": "none"}},
    }
    if trace is not None:
        t = tmp_path / "t.jsonl"
        t.write_text("".join(line + "\n" for line in trace))
        over["workload"] = {"type": "trace", "path": str(t)}
    return load_scenario(write_scenario(tmp_path, toy_scenario(tmp_path, **over)))


def _latencies_ms(tmp_path: Path, slice_: str | None) -> list[float]:
    ld = _load(
        tmp_path,
        slice_,
        ['{"t_s": 1.0, "model": "slow"}', '{"t_s": 1.5, "model": "fast"}'],
    )
    rec = simulate(ld, "one")
    return [
        round((f - a) * 1000, 6)
        for a, f in zip(rec.requests.arrival_s, rec.requests.finish_s, strict=True)
    ]


def test_a_mig_slice_runs_at_its_compute_fraction(tmp_path: Path) -> None:
    # the toy profiles: slow b1 = 10 ms, fast b1 = 2 ms; a 3g slice takes 7/3 as long
    assert _latencies_ms(tmp_path, None) == [10.0, 2.0]
    sliced = _latencies_ms(tmp_path, "mig=3g.20gb")
    assert sliced == pytest.approx([10.0 * 7 / 3, 2.0 * 7 / 3])
    assert _latencies_ms(tmp_path, "share=1/2") == [10.0, 2.0]  # a share runs at full speed


@pytest.mark.parametrize(
    ("slice_", "total_gib"), [(None, 40), ("mig=3g.20gb", 20), ("share=1/4", 10)]
)
def test_a_sliced_devices_memory_cap(tmp_path: Path, slice_: str | None, total_gib: float) -> None:
    ld = _load(tmp_path, slice_)
    sim = Simulation(ld, "one")
    assert sim.by_name["d0"].sched.memory.used_total()[1] == total_gib * GIB


def test_a_bad_slice_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        _load(tmp_path, "mig=3g.twentygb")
    msg = str(ei.value)
    assert "devices.0.slice" in msg and "mig='3g.twentygb'" in msg, msg


def test_the_mig_slices_scenario(tmp_path: Path) -> None:
    """scenarios/mig-slices.yaml, shortened: slices with their own memory and speed."""
    root = Path(__file__).resolve().parents[3]
    ld = load_scenario(root / "scenarios" / "mig-slices.yaml", ["duration_s=4", "warmup_s=1"])
    sim = Simulation(ld, "least-expected-work")
    assert sim.by_name["mig3g0"].sched.memory.used_total()[1] == 40 * GIB
    assert sim.by_name["mig1g"].sched.memory.used_total()[1] == 10 * GIB
    whole = ld.profile_sets["fast"]["resnet50"].latency_s(8)
    assert sim.by_name["mig1g"].profiles["resnet50"].latency_s(8) == pytest.approx(whole * 7)
    rec = simulate(ld, "least-expected-work")
    assert len(rec.requests.arrival_s) > 0
