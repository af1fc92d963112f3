"""A cluster file read back as a scenario (the reverse of write_arm_cluster), and its errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from evenserve.cluster.file import load_cluster
from evenserve.core.errors import ConfigError
from evenserve.experiment.cluster import write_arm_cluster, write_profile_sets
from evenserve.experiment.cluster_scenario import cluster_scenario, replay_on_cluster
from evenserve.sched import batching_setup
from evenserve.sim.loader import LoadedScenario, load_scenario
from evenserve.workload import Arrival, write_trace

from .scenarios import REPO, scenario, write


def _cluster(tmp_path: Path, arm: str = "classes", **over: Any) -> tuple[LoadedScenario, Path]:
    loaded = load_scenario(write(tmp_path, scenario(**over)))
    dirs = write_profile_sets(loaded, tmp_path / "w")
    return loaded, write_arm_cluster(loaded, arm, REPO, tmp_path / "w", dirs, seed=9)


def _edit(path: Path, change: Any) -> Path:
    raw = yaml.safe_load(path.read_text())
    change(raw)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("arm", ["classes", "baseline"])
def test_a_scenario_arm_round_trips_through_its_cluster(tmp_path: Path, arm: str) -> None:
    loaded, path = _cluster(tmp_path, arm)
    sc, back = loaded.scenario, cluster_scenario(load_cluster(path), str(path)).scenario
    assert [d.name for d in back.devices] == [d.name for d in sc.arm_devices(arm)]
    for a, b in zip(sc.arm_devices(arm), back.devices, strict=True):
        assert b.models == a.models
        assert (b.memory_gb, b.instances, b.interference) == (
            a.memory_gb,
            a.instances,
            a.interference,
        )
    for m, spec in sc.models.items():
        got = back.models[m]
        assert (got.slo_ms, got.priority, got.deadline_ms) == (
            spec.slo_ms,
            spec.priority,
            spec.deadline_ms,
        )
    (name, got_arm), want = next(iter(back.arms.items())), sc.arms[arm]
    assert name == f"bench-small-{arm}"
    assert got_arm.routing == want.routing
    assert got_arm.overload_refusals == want.overload_refusals
    assert got_arm.learn_profiles == want.learn_profiles
    assert got_arm.max_queue_per_model == want.max_queue_per_model
    assert got_arm.class_headroom == want.class_headroom
    for m in sc.models:
        spec = want.batching_per_model.get(m, want.batching)
        cap = yaml.safe_load((REPO / m / "model.yaml").read_text())["max_batch_size"]
        assert got_arm.batching_per_model[m] == batching_setup(spec, cap, "t").spec
    assert back.signals == sc.signals
    # The profiles are the scenario's (written out and read back).
    ps = cluster_scenario(load_cluster(path)).profile_sets
    assert set(next(iter(ps.values()))) == set(next(iter(loaded.profile_sets.values())))


def test_the_workers_learn_profiles_and_slowdown(tmp_path: Path) -> None:
    _, path = _cluster(tmp_path)

    def change(raw: dict[str, Any]) -> None:
        for d in raw["workers"]["devices"]:
            d["extra_args"] += ["--learn-profiles"]
        raw["workers"]["devices"][0]["extra_args"] += ["--slowdown", "2"]
        del raw["name"]

    back = cluster_scenario(load_cluster(_edit(path, change))).scenario
    assert list(back.arms) == ["live"] and back.arms["live"].learn_profiles
    assert [d.slowdown for d in back.devices] == [2.0, 1.0, 1.0]


def test_a_trace_on_a_cluster_lasts_its_span(tmp_path: Path) -> None:
    _, path = _cluster(tmp_path)
    trace = tmp_path / "rec.jsonl"
    write_trace(trace, [Arrival(i * 0.01, "resnet50") for i in range(250)])
    sc = replay_on_cluster(path, trace).scenario
    assert sc.workload.type == "trace" and sc.duration_s == 4.0


def test_a_real_device_needs_profiles(tmp_path: Path) -> None:
    _, path = _cluster(tmp_path)

    def change(raw: dict[str, Any]) -> None:
        raw["workers"]["devices"][1]["device"] = "cuda:0"

    with pytest.raises(
        ConfigError, match=r"workers\.devices\.1 \(gpu1\).*workers\.devices\.1\.profiles"
    ):
        cluster_scenario(load_cluster(_edit(path, change)))

    def give(raw: dict[str, Any]) -> None:
        raw["workers"]["devices"][1]["profiles"] = str(tmp_path / "w" / "profiles" / "a10")

    back = cluster_scenario(load_cluster(_edit(path, give))).scenario
    assert back.devices[1].models == ["resnet50", "bert-base"]


def test_a_static_backend_needs_profiles(tmp_path: Path) -> None:
    _, path = _cluster(tmp_path)

    def change(raw: dict[str, Any]) -> None:
        raw["backends"] = [{"name": "t0", "url": "http://127.0.0.1:9", "models": ["resnet50"]}]

    with pytest.raises(ConfigError, match=r"backends\.0 \(t0\).*backends\.0\.profiles"):
        cluster_scenario(load_cluster(_edit(path, change)))


def test_a_model_without_slo_names_the_model_and_file(tmp_path: Path) -> None:
    _, path = _cluster(tmp_path)
    mfile = tmp_path / "w" / "repo" / "bert-base" / "model.yaml"
    raw = yaml.safe_load(mfile.read_text())
    del raw["slo_ms"]
    mfile.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"models\.bert-base: .*bert-base/model\.yaml: slo_ms"):
        cluster_scenario(load_cluster(path))
