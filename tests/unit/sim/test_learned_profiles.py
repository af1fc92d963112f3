"""Profiles that learn, simulated (scenarios/slowdown.yaml, shortened): while gpu3 runs 2x
slower than its profile, least-expected-work with ``learn_profiles`` leaves it far less work
than without, so the requests it serves wait far less."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario


def _slow_device_p99_ms(root: Path, arm: str, seed: int) -> float:
    # 30 s: the slowdown (20-40 s) covers the last 10 s.
    loaded = load_scenario(root / "scenarios" / "slowdown.yaml", ["duration_s=30"])
    log = simulate(loaded, arm, seed).requests
    arrival = np.array(log.arrival_s)
    latency = np.array(log.finish_s) - arrival
    on = (np.array(log.device) == "gpu3") & (arrival >= 22.0) & ~np.isnan(latency)
    return float(np.percentile(latency[on], 99) * 1000.0)


def test_learning_cuts_the_slow_devices_p99(repo_root: Path) -> None:
    for seed in (1, 2):
        plain = _slow_device_p99_ms(repo_root, "least-expected-work", seed)
        learned = _slow_device_p99_ms(repo_root, "least-expected-work-learned", seed)
        # Measured here: 104.6 / 100.3 ms without, 35.2 / 49.3 ms with (seeds 1, 2; the
        # bench's 3 seeds of the full run: 105.8 vs 52.0); 0.75 leaves a wide gap both ways.
        assert learned < 0.75 * plain, (seed, plain, learned)
