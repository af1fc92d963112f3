"""The batch-cap rule (``sched.setup``): a policy's missing max_batch_size is the model's, a
larger one is refused; the simulator and the worker apply it alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from evenserve.core.errors import ConfigError
from evenserve.sched import batching_setup
from evenserve.sim.cluster import Simulation
from evenserve.sim.loader import load_scenario
from evenserve.worker.repository import load_repository
from tests.unit.sim.scenarios import toy_scenario, write_scenario

MODEL = {
    "runtime": "emulated",
    "max_batch_size": 4,
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
}
SPECS: list[Any] = [
    "fixed-window",
    {"policy": "deadline"},
    {"policy": "fixed-window", "max_batch_size": 2},
    {"policy": "static", "batch_size": 3},
    "none",
]
OVER: list[Any] = [
    {"policy": "fixed-window", "max_batch_size": 16},
    {"policy": "static", "batch_size": 5},
]


def test_a_missing_cap_is_the_models_and_a_larger_one_is_refused() -> None:
    b = batching_setup({"policy": "fixed-window", "max_batch_delay_ms": 0}, 32, "w")
    assert b.spec == {"policy": "fixed-window", "max_batch_delay_ms": 0, "max_batch_size": 32}
    assert b.policy.max_batch_size == 32
    assert batching_setup("static", 32, "w").spec == {"policy": "static"}  # no such parameter
    with pytest.raises(ConfigError) as exc:
        batching_setup({"policy": "fixed-window", "max_batch_size": 64}, 32, "params.m")
    assert str(exc.value) == (
        "params.m.max_batch_size: the policy's batch size (64) exceeds the model's "
        "max_batch_size (32)"
    )


def test_a_model_without_a_cap_keeps_the_policys_own() -> None:
    b = batching_setup("fixed-window", None, "w")
    assert b.spec == "fixed-window" and b.policy.max_batch_size == 8
    assert batching_setup({"policy": "fixed-window", "max_batch_size": 64}, None, "w").spec


def _sim(tmp_path: Path, spec: Any, cap: int | None) -> Simulation:
    models: dict[str, Any] = {"fast": {"slo_ms": 50}, "slow": {"slo_ms": 200}}
    if cap is not None:
        models["fast"]["max_batch_size"] = cap
    arms = {
        "a": {
            "routing": "round-robin",
            "batching": "fixed-window",
            "batching_per_model": {"fast": spec},
        }
    }
    sc = toy_scenario(tmp_path, models=models, arms=arms)
    return Simulation(load_scenario(write_scenario(tmp_path, sc)), "a")


def _entry(tmp_path: Path, spec: Any) -> Any:
    d = tmp_path / "repo" / "fast"
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.yaml").write_text(yaml.safe_dump({**MODEL, "batching": spec}))
    (entry,) = load_repository(tmp_path / "repo", check_profiles=False)
    return entry


@pytest.mark.parametrize("spec", SPECS)
def test_the_simulator_and_the_worker_default_alike(tmp_path: Path, spec: Any) -> None:
    sim = _sim(tmp_path, spec, 4)
    worker = _entry(tmp_path, spec)
    assert sim.batching("fast").spec == worker.batching_spec()
    cap = worker.build_policy().max_batch_size
    assert sim.devices[0].sched.max_batch_size["fast"] == cap
    (d0,) = [d for d in sim.devices if d.name == "d0"]
    assert d0.sched.max_batch_size["slow"] == 8  # a model without a cap: the policy's own


@pytest.mark.parametrize("spec", OVER)
def test_the_simulator_and_the_worker_refuse_alike(tmp_path: Path, spec: Any) -> None:
    with pytest.raises(ConfigError) as sim_error:
        _sim(tmp_path, spec, 4)
    with pytest.raises(ConfigError) as worker_error:
        _entry(tmp_path, spec)
    sim_msg, worker_msg = str(sim_error.value), str(worker_error.value)
    assert sim_msg.startswith("arms.a.batching_per_model.fast.max_batch_size: ")
    assert worker_msg.endswith(sim_msg.partition(".max_batch_size: ")[2])
    assert "exceeds the model's max_batch_size (4)" in worker_msg
    _sim(tmp_path / "none", spec, None)  # no cap of the model's: nothing to exceed
