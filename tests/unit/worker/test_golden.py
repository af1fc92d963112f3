"""Golden test: one arrival trace, the same batch decisions in the simulator and the live driver.

The simulator (sim.cluster, event heap, virtual clock) and the worker's BatchDriver (asyncio
callbacks, FakeClock + FakeTimer, virtual device) both drive the same batching policy
objects through policy.batching.device.next_batch; for the same arrivals they must start the
same batches, in the same order, at the same times.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from evenserve.policy.batching import BATCHING
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario

from .fakes import make_driver, profile

PROFILES = {
    "fast": {1: 2.0, 4: 4.0, 8: 6.0},
    "slow": {1: 7.0, 4: 15.0, 8: 24.0},
}

ARMS = {
    "fixed": {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 4},
    "static": {"policy": "static", "batch_size": 4, "max_wait_ms": 6},
    "none": "none",
}


def _trace(path: Path, n: int = 400, seed: int = 11) -> list[tuple[float, str]]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        # Bursty arrivals: mostly dense, sometimes a pause longer than any window.
        t += rng.expovariate(900.0) if rng.random() < 0.9 else rng.uniform(0.02, 0.05)
        out.append((round(t, 9), rng.choice(["fast", "slow"])))
    path.write_text("".join(json.dumps({"t_s": t, "model": m}) + "\n" for t, m in out))
    return out


@pytest.mark.parametrize("arm", sorted(ARMS))
async def test_simulator_and_live_driver_make_the_same_batches(tmp_path: Path, arm: str) -> None:
    prof_dir = tmp_path / "profiles"
    prof_dir.mkdir()
    for m, pts in PROFILES.items():
        (prof_dir / f"{m}.yaml").write_text(
            yaml.safe_dump(
                {
                    "model": m,
                    "device": "toy",
                    "runtime": "test",
                    "precision": "fp32",
                    "source": "test",
                    "points": [{"batch": b, "latency_ms": v} for b, v in pts.items()],
                }
            )
        )
    trace = _trace(tmp_path / "trace.jsonl")
    end = trace[-1][0] + 1.0
    (tmp_path / "sc.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "golden",
                "seed": 0,
                "duration_s": end,
                "profile_sets": {"toy": "profiles"},
                "devices": [{"name": "dev0", "models": ["fast", "slow"]}],
                "models": {"fast": {"slo_ms": 100}, "slow": {"slo_ms": 100}},
                "workload": {"type": "trace", "path": "trace.jsonl"},
                "arms": {arm: {"routing": "round-robin", "batching": ARMS[arm]}},
            }
        )
    )
    records = simulate(load_scenario(tmp_path / "sc.yaml"), arm)
    sim_dev = records.devices[0]

    profiles = {m: profile(m, pts) for m, pts in PROFILES.items()}
    h = make_driver({m: ARMS[arm] for m in PROFILES}, profiles)
    for t, m in trace:
        h.timer.advance_to(t)
        h.driver.submit(m, None)
    h.timer.run_until_idle()

    live_sizes = [n for _, _, n in h.rec.started]
    live_starts = [t for t, _, _ in h.rec.started]
    assert len(live_sizes) > 50
    assert max(live_sizes) > 1 or arm == "none"  # the trace does exercise batching
    assert live_sizes == sim_dev.batch_sizes
    assert live_starts == pytest.approx(sim_dev.busy_start_s, abs=1e-9)
    assert sum(live_sizes) == len(trace)
    BATCHING.build(ARMS[arm])  # the spec is a registered policy, as both sides used
