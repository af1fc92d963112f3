"""An arm compiled into a cluster: the repository, the cluster YAML, the profile folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from evenserve.cluster.file import load_cluster
from evenserve.core.errors import ConfigError
from evenserve.core.profile import load_profile_set
from evenserve.core.scenario import default_load_times_s
from evenserve.experiment.cluster import (
    model_cap_overrides,
    write_arm_cluster,
    write_payloads,
    write_profile_sets,
)
from evenserve.experiment.scaling import scale_scenario
from evenserve.gateway.placement_catalogue import cluster_setup
from evenserve.sim.cluster import Simulation
from evenserve.sim.loader import LoadedScenario, load_scenario

from .scenarios import REPO, scenario, write


def _scaled(tmp_path: Path, **over: object) -> LoadedScenario:
    loaded = load_scenario(write(tmp_path, scenario(**over)))
    return scale_scenario(loaded, 5.0, 20.0, 4.0, tmp_path)


def test_profile_sets_are_written_as_scaled(tmp_path: Path) -> None:
    scaled = _scaled(tmp_path)
    dirs = write_profile_sets(scaled, tmp_path / "w")
    assert dirs == {"a10": (tmp_path / "w" / "profiles" / "a10").resolve()}
    back = load_profile_set(dirs["a10"])
    for m, p in scaled.profile_sets["a10"].items():
        assert back[m].latency_ms == pytest.approx(p.latency_ms)
        assert back[m].batches == p.batches and back[m].weights_mb == p.weights_mb


def test_the_models_caps_come_from_the_repository_where_the_scenario_gives_none(
    tmp_path: Path,
) -> None:
    """The worker applies the batch-cap rule itself: the arm's spec goes as written, with the
    scenario model's max_batch_size; the bench gives a model without one its model.yaml's,
    so the simulator applies the rule with the same cap."""
    models = {"resnet50": {"slo_ms": 10, "max_batch_size": 16}, "bert-base": {"slo_ms": 15}}
    arms = {"a": {"routing": "round-robin", "batching": "fixed-window"}}
    path = write(tmp_path, scenario(models=models, arms=arms))
    source = yaml.safe_load((REPO / "bert-base" / "model.yaml").read_text())
    caps = model_cap_overrides(load_scenario(path), REPO)
    assert caps == [f"models.bert-base.max_batch_size={source['max_batch_size']}"]
    loaded = load_scenario(path, caps)
    assert loaded.scenario.models["bert-base"].max_batch_size == source["max_batch_size"]
    scaled = scale_scenario(loaded, 5.0, 20.0, 4.0, tmp_path)
    dirs = write_profile_sets(scaled, tmp_path / "w")
    write_arm_cluster(scaled, "a", REPO, tmp_path / "w", dirs, seed=9)
    repo = tmp_path / "w" / "repo"
    resnet = yaml.safe_load((repo / "resnet50" / "model.yaml").read_text())
    bert = yaml.safe_load((repo / "bert-base" / "model.yaml").read_text())
    assert resnet["batching"] == "fixed-window" and resnet["max_batch_size"] == 16
    assert bert["max_batch_size"] == source["max_batch_size"]


def test_an_arm_compiled_into_a_cluster(tmp_path: Path) -> None:
    scaled = _scaled(tmp_path)
    dirs = write_profile_sets(scaled, tmp_path / "w")
    path = write_arm_cluster(scaled, "classes", REPO, tmp_path / "w", dirs, seed=9)
    repo = tmp_path / "w" / "repo"
    resnet = yaml.safe_load((repo / "resnet50" / "model.yaml").read_text())
    bert = yaml.safe_load((repo / "bert-base" / "model.yaml").read_text())
    source = yaml.safe_load((REPO / "resnet50" / "model.yaml").read_text())
    assert resnet["inputs"] == source["inputs"] and resnet["outputs"] == source["outputs"]
    assert resnet["emulated"] == {"profile_name": "resnet50"} and "profile" not in resnet
    assert resnet["batching"] == {"policy": "fixed-window", "max_batch_delay_ms": 2}
    assert bert["batching"] == "none"  # the arm's per-model batching, as written
    # The scaled SLO and deadline, the class.
    assert (resnet["slo_ms"], resnet["deadline_ms"], resnet["priority"]) == (50.0, 150.0, "online")
    assert (bert["slo_ms"], bert["priority"], bert["deadline_ms"]) == (75.0, 0, None)
    assert "queue_timeout_ms" not in resnet and "max_queue_size" not in resnet
    assert resnet["max_batch_size"] == source["max_batch_size"]  # the scenario gives none

    raw = yaml.safe_load(path.read_text())
    gw = raw["gateway"]
    assert (gw["host"], gw["routing"], gw["seed"]) == ("127.0.0.1", "least-expected-work", 9)
    assert gw["signals"] == {"interval_ms": 50, "window": 2}
    devices = raw["workers"]["devices"]
    assert [d["name"] for d in devices] == ["gpu0", "gpu1", "solo"]
    gpu0, solo = devices[0], devices[2]
    assert gpu0["device"] == f"emulated:{dirs['a10']}"
    # The scenario's device and arm options, under their own names.
    assert (gpu0["instances"], gpu0["starvation_ms"], gpu0["class_headroom"]) == (2, 500, 0.5)
    assert gpu0["max_queue_per_model"] == 40 and "max_batch_size" not in gpu0
    args = gpu0["extra_args"]
    assert args[args.index("--utilization-window-s") + 1] == "0.5"
    assert (solo["models"], solo["memory_gb"]) == (["resnet50"], 16)
    assert len({d["port"] for d in devices} | {gw["port"]}) == 4
    # The gateway's own loader takes it, and the launcher passes them as the worker's flags.
    cluster = load_cluster(path)
    workers = cluster.config.workers
    assert workers is not None
    assert [d.name for d in workers.devices] == ["gpu0", "gpu1", "solo"]
    flags = workers.devices[0].option_flags()
    for flag, value in [
        ("--instances", "2"),
        ("--max-queue-per-model", "40"),
        ("--starvation-ms", "500.0"),
        ("--class-headroom", "0.5"),
    ]:
        assert flags[flags.index(flag) + 1] == value

    base = yaml.safe_load(
        write_arm_cluster(scaled, "baseline", REPO, tmp_path / "b", dirs, seed=9).read_text()
    )
    assert base["gateway"]["routing"] == "round-robin"
    assert "starvation_ms" not in base["workers"]["devices"][0]


def test_a_fifo_arm_runs_live_with_every_class_alike(tmp_path: Path) -> None:
    arms = {"fifo": {"routing": "round-robin", "batching": "none", "ignore_priority": True}}
    scaled = _scaled(tmp_path, arms=arms)
    dirs = write_profile_sets(scaled, tmp_path / "w")
    path = write_arm_cluster(scaled, "fifo", REPO, tmp_path / "w", dirs, seed=1)
    workers = load_cluster(path).config.workers
    assert workers is not None
    assert "--ignore-priority" in workers.devices[0].option_flags()


def test_repositories_the_live_bench_cannot_run(tmp_path: Path) -> None:
    scaled = _scaled(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"models\.resnet50: no .*--repo"):
        write_arm_cluster(scaled, "baseline", empty, tmp_path / "w", {}, seed=1)
    other = tmp_path / "other"
    for m in ("resnet50", "bert-base"):
        (other / m).mkdir(parents=True)
        (other / m / "model.yaml").write_text("runtime: onnx\n")
    with pytest.raises(ConfigError, match="emulated models only"):
        write_arm_cluster(scaled, "baseline", other, tmp_path / "w", {}, seed=1)


def _placement_scenario(tmp_path: Path) -> LoadedScenario:
    """Two devices and a spare; two placement arms on different devices."""
    over = {
        "devices": [
            {"name": "g0", "memory_gb": 3, "models": ["resnet50"]},
            {"name": "g1", "memory_gb": 2, "models": ["bert-base"]},
            {"name": "sp", "memory_gb": 4, "active": False, "start_ms": 1500},
        ],
        "models": {  # batch caps as the bench gives them (the repository's, or smaller)
            "resnet50": {"slo_ms": 10, "load_ms": 300, "max_batch_size": 8},
            "bert-base": {"slo_ms": 15, "profile": "bert-base", "max_batch_size": 16},
        },
        "arms": {
            "cost": {
                "routing": "least-expected-work",
                "batching": "fixed-window",
                "devices": ["g0", "sp"],
                "placement": {"policy": "lru"},
                "autoscaling": {"policy": "demand", "target_utilization": 0.5},
                "placement_interval_ms": 500,
                "load_wait_ms": 2000,
                "host_memory_gb": 2,
            },
            "plain": {"routing": "round-robin", "batching": "none", "devices": ["g0", "g1"]},
        },
    }
    return _scaled(tmp_path, **over)  # K = 5


def test_a_placement_arm_compiled_into_a_cluster(tmp_path: Path) -> None:
    scaled = _placement_scenario(tmp_path)
    dirs = write_profile_sets(scaled, tmp_path / "w")
    path = write_arm_cluster(scaled, "cost", REPO, tmp_path / "w", dirs, seed=2)
    raw = yaml.safe_load(path.read_text())
    gw = raw["gateway"]
    # The arm's policy with its scaled interval and load-wait bound, its host memory.
    assert gw["placement"] == {
        "policy": "lru",
        "interval_ms": 2500.0,
        "load_wait_ms": 10000.0,
        "host_memory_gb": 2.0,
    }
    assert gw["autoscaling"] == {"policy": "demand", "target_utilization": 0.5}
    devices = raw["workers"]["devices"]
    assert [d["name"] for d in devices] == ["g0", "sp"]  # only the arm's
    g0, sp = devices
    assert (g0["models"], g0["memory_gb"]) == (["resnet50"], 3)
    assert "active" not in g0
    assert sp["active"] is False and "models" not in sp and sp["memory_gb"] == 4
    # Load times, scaled as the batches are: the given 300 ms, and the default from the
    # weights made explicit; the worker sleeps them.
    repo = tmp_path / "w" / "repo"
    resnet = yaml.safe_load((repo / "resnet50" / "model.yaml").read_text())
    bert = yaml.safe_load((repo / "bert-base" / "model.yaml").read_text())
    r_weights = scaled.profile_sets["a10"]["resnet50"].weights_bytes
    _, r_warm = scaled.scenario.models["resnet50"].load_times_s(r_weights)
    assert resnet["emulated"] == {
        "profile_name": "resnet50",
        "load_ms": 1500.0,
        "warm_load_ms": round(r_warm * 1000, 3),  # the scaled default: the worker's warm load
    }
    weights = scaled.profile_sets["a10"]["bert-base"].weights_bytes
    cold, warm = default_load_times_s(weights)
    assert bert["emulated"]["load_ms"] == pytest.approx(cold * 1000 * 5, abs=1e-3)
    assert bert["emulated"]["warm_load_ms"] == pytest.approx(warm * 1000 * 5, abs=1e-3)
    # The gateway's own loader takes it: a spare, and a catalogue whose load times and
    # weights are the simulator's (the same numbers the controller plans with there).
    cluster = load_cluster(path)
    workers = cluster.config.workers
    assert workers is not None
    assert [d.active for d in workers.devices] == [True, False]
    infos, setups = cluster_setup(cluster, {"a10": scaled.profile_sets["a10"]})
    assert [(d.name, d.active, d.models) for d in setups] == [
        ("g0", True, ("resnet50",)),
        ("sp", False, ()),
    ]
    sim_cold, sim_warm = scaled.scenario.models["bert-base"].load_times_s(weights)
    assert infos["bert-base"].cold_load_s == pytest.approx(sim_cold, abs=1e-6)
    assert infos["bert-base"].warm_load_s == pytest.approx(sim_warm, abs=1e-6)
    assert infos["resnet50"].cold_load_s == pytest.approx(1.5)
    assert infos["bert-base"].weights_bytes == weights
    # The controller's entry is the simulator's: the batch each model runs at (the batch-cap
    # rule over its model.yaml, not the profile's largest batch), that batch's time, its SLO.
    sim = Simulation(scaled, "cost", 1)
    assert sim.placement is not None
    for m, want in sim.placement.controller.models.items():
        got = infos[m]
        assert (got.max_batch_size, got.batch_s, got.slo_s) == (
            want.max_batch_size,
            pytest.approx(want.batch_s),
            pytest.approx(want.slo_s),
        )
        assert got.max_batch_size < max(scaled.profile_sets["a10"][m].batches)


def test_a_plain_arm_keeps_its_devices_and_no_placement(tmp_path: Path) -> None:
    scaled = _placement_scenario(tmp_path)
    dirs = write_profile_sets(scaled, tmp_path / "w")
    raw = yaml.safe_load(
        write_arm_cluster(scaled, "plain", REPO, tmp_path / "w", dirs, seed=2).read_text()
    )
    assert "placement" not in raw["gateway"] and "autoscaling" not in raw["gateway"]
    assert [d["name"] for d in raw["workers"]["devices"]] == ["g0", "g1"]
    resnet = yaml.safe_load((tmp_path / "w" / "repo" / "resnet50" / "model.yaml").read_text())
    assert resnet["emulated"] == {"profile_name": "resnet50"}


def test_payloads_for_models_that_start_cold(tmp_path: Path) -> None:
    scaled = _placement_scenario(tmp_path)
    files = write_payloads(scaled, REPO, tmp_path / "w")
    bert = json.loads(files["bert-base"].read_text())
    ids, mask = bert["inputs"]
    assert (ids["name"], ids["datatype"], ids["shape"]) == ("input_ids", "INT64", [1, 128])
    assert set(ids["data"]) == {0} and set(mask["data"]) == {1}  # each synthetic low
    resnet = json.loads(files["resnet50"].read_text())["inputs"][0]
    assert resnet["shape"] == [1, 3, 224, 224] and len(resnet["data"]) == 3 * 224 * 224


def test_free_port_never_hands_out_a_port_of_the_same_cluster_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from evenserve.experiment import cluster as cl

    handed = iter([5001, 5001, 5002])  # the OS may give the same free port twice in a row

    class FakeSocket:
        def __init__(self, *_: object) -> None:
            self.port = next(handed)

        def __enter__(self) -> FakeSocket:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        def bind(self, _: object) -> None:
            return None

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(cl.socket, "socket", FakeSocket)
    taken: set[int] = set()
    assert [cl.free_port(taken), cl.free_port(taken)] == [5001, 5002]
    assert taken == {5001, 5002}


def test_a_slowdown_and_learning_reach_the_workers_flags(tmp_path: Path) -> None:
    sc = scenario()
    sc["devices"][1]["slowdown"] = 1.5
    sc["devices"][1]["slowdown_phases"] = [{"start_s": 2, "end_s": 4, "multiplier": 2}]
    sc["arms"]["classes"]["learn_profiles"] = True
    scaled = _scaled(tmp_path, **sc)
    (solo,) = [d for d in scaled.scenario.devices if d.name == "solo"]
    assert [(p.start_s, p.end_s) for p in solo.slowdown_phases] == [(10.0, 20.0)]  # K = 5
    dirs = write_profile_sets(scaled, tmp_path / "w")
    for arm, learn in (("classes", True), ("baseline", False)):
        path = write_arm_cluster(scaled, arm, REPO, tmp_path / arm, dirs, seed=9)
        devices = {d["name"]: d for d in yaml.safe_load(path.read_text())["workers"]["devices"]}
        args = devices["solo"]["extra_args"]
        i = args.index("--slowdown-phases")
        assert args[i + 1] == "10.0:20.0:2.0"
        assert args[args.index("--slowdown") + 1] == "1.5"
        others = [d for n, d in devices.items() if n != "solo"]
        assert others and all("--slowdown" not in d["extra_args"] for d in others)
        assert ("--learn-profiles" in args) is learn
