"""A device slower than its profiles say (``devices[].slowdown``, ``slowdown_phases``): its
batches really take longer, while the scheduler's own estimates still read the profile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evenserve.core.errors import ConfigError
from evenserve.sim.cluster import Simulation
from evenserve.sim.loader import load_scenario
from tests.unit.sim.scenarios import toy_scenario, write_scenario


def _batch_times(tmp_path: Path, device: dict[str, object]) -> tuple[np.ndarray, np.ndarray]:
    """(start, duration) of every batch on one device running ``fast`` in batches of 4."""
    sc = toy_scenario(
        tmp_path,
        devices=[{"name": "d0", "models": ["fast"], "memory_gb": 8, **device}],
        models={"fast": {"slo_ms": 500}},
        workload={"type": "open-loop", "rates_rps": {"fast": 100}},
        arms={"a": {"routing": "round-robin", "batching": {"policy": "static", "batch_size": 4}}},
    )
    sim = Simulation(load_scenario(write_scenario(tmp_path, sc)), "a")
    rec = sim.run()
    (tr,) = rec.devices
    start = np.array(tr.busy_start_s)
    return start, np.array(tr.busy_end_s) - start


def test_slowdown_stretches_batches(tmp_path: Path) -> None:
    _, plain = _batch_times(tmp_path, {})
    _, slow = _batch_times(tmp_path, {"slowdown": 2.0})
    assert np.allclose(plain, 0.004)  # the profile's batch of 4
    assert np.allclose(slow, 0.008)


def test_slowdown_phase_only_inside_it(tmp_path: Path) -> None:
    start, took = _batch_times(
        tmp_path, {"slowdown_phases": [{"start_s": 5, "end_s": 10, "multiplier": 3}]}
    )
    inside = (start >= 5) & (start < 10)
    assert inside.any() and (~inside).any()
    assert np.allclose(took[inside], 0.012)
    assert np.allclose(took[~inside], 0.004)


def test_overlapping_phases_refused(tmp_path: Path) -> None:
    sc = toy_scenario(tmp_path)
    sc["devices"][0]["slowdown_phases"] = [
        {"start_s": 1, "end_s": 5, "multiplier": 2},
        {"start_s": 4, "end_s": 6, "multiplier": 2},
    ]
    with pytest.raises(ConfigError, match=r"devices.*slowdown_phases: .*overlap"):
        load_scenario(write_scenario(tmp_path, sc))
