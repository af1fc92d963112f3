"""Bad scenario files fail at load with one clear message naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evenserve.core.errors import ConfigError
from evenserve.sim.loader import load_scenario
from tests.unit.sim.scenarios import toy_scenario, write_scenario


def test_good_scenario_loads(tmp_path: Path) -> None:
    ld = load_scenario(write_scenario(tmp_path, toy_scenario(tmp_path)))
    assert ld.scenario.name == "toy"
    assert set(ld.profiles_for(ld.scenario.devices[0])) == {"fast", "slow"}


def mutate(tmp_path: Path, fn: Any) -> Path:
    sc = toy_scenario(tmp_path)
    fn(sc)
    return write_scenario(tmp_path, sc)


BAD = [
    (
        lambda sc: sc["arms"]["optimized"].update(routing="telepathy"),
        "arms.optimized.routing: unknown routing policy 'telepathy'",
    ),
    (
        lambda sc: sc["arms"]["baseline"].update(batching={"policy": "nope"}),
        "arms.baseline.batching.policy: unknown batching policy 'nope'",
    ),
    (
        lambda sc: sc["arms"]["baseline"].update(batching={"policy": "static", "batch_size": -2}),
        "arms.baseline.batching.batch_size",
    ),
    (
        lambda sc: sc["models"].update(orphan={"slo_ms": 10}),
        "models.orphan: not placed on any device",
    ),
    (
        lambda sc: sc["workload"]["rates_rps"].update(fast=-5),
        "workload.open-loop.rates_rps.fast",
    ),
    (
        lambda sc: sc["devices"][0]["models"].append("ghost"),
        "devices[0].models: unknown model 'ghost'",
    ),
    (
        lambda sc: sc["models"]["slow"].update(profile="missing"),
        "models.slow.profile: no profile 'missing'",
    ),
    (
        lambda sc: sc.update(profile_sets={"toy": "profiles/none"}),
        "profile_sets.toy: profile set not found",
    ),
    (lambda sc: sc.update(warmup_s=50), "warmup_s must be less than duration_s"),
    (lambda sc: sc.pop("arms"), "arms: Field required"),
    (lambda sc: sc.update(surprise=1), "surprise: Extra inputs are not permitted"),
    (
        lambda sc: sc.update(
            workload={"type": "closed-loop", "users": 0, "think_ms": 1, "mix": {"fast": 1}}
        ),
        "workload.closed-loop.users",
    ),
    (lambda sc: sc["models"]["fast"].update(slo_ms=0), "models.fast.slo_ms"),
]


@pytest.mark.parametrize(("fn", "needle"), BAD)
def test_bad_scenarios_name_the_field(tmp_path: Path, fn: Any, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_scenario(mutate(tmp_path, fn))
    assert needle in str(err.value)


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_scenario(tmp_path / "nope.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("name: [oops\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_scenario(p)


def test_overrides(tmp_path: Path) -> None:
    p = write_scenario(tmp_path, toy_scenario(tmp_path))
    ld = load_scenario(
        p,
        [
            "duration_s=7",
            "workload.rates_rps.fast=12.5",
            "arms.optimized.batching.max_batch_delay_ms=30",
            "arms.baseline.routing.policy=power-of-two",
            "devices.1.memory_gb=16",
        ],
    )
    sc = ld.scenario
    assert sc.duration_s == 7
    assert sc.workload.rates_rps["fast"] == 12.5  # type: ignore[union-attr]
    assert sc.arms["optimized"].batching["max_batch_delay_ms"] == 30
    assert sc.arms["baseline"].routing == {"policy": "power-of-two"}
    assert sc.devices[1].memory_gb == 16
    with pytest.raises(ConfigError, match="key=value"):
        load_scenario(p, ["duration_s"])
    with pytest.raises(ConfigError, match="no list item"):
        load_scenario(p, ["devices.9.memory_gb=1"])


def test_device_count_expansion(tmp_path: Path) -> None:
    sc = toy_scenario(tmp_path)
    sc["devices"] = [{"name": "g", "count": 3, "models": ["fast", "slow"]}]
    ld = load_scenario(write_scenario(tmp_path, sc))
    assert [d.name for d in ld.scenario.expanded_devices()] == ["g0", "g1", "g2"]
