"""bench/llm_placement_live.py and its scenario: the parts that need no live run (the
simulator's side, the cluster file the live side runs, the figures from index reads)."""

from __future__ import annotations

from pathlib import Path

import yaml

from evenserve.cluster.file import load_cluster
from evenserve.gateway.placement_catalogue import cluster_setup
from evenserve.sim.llm_placement import _Pool, run_placement_arm
from evenserve.sim.llm_placement_scenario import load_llm_placement_scenario
from tests.unit.bench.bench_module import load

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "scenarios" / "llm-morning-live.yaml"


def test_the_simulator_wakes_the_sleeping_llm_within_the_bound() -> None:
    bench = load("llm_placement_live")
    sc = load_llm_placement_scenario(SCENARIO)
    arm = bench.the_arm(sc)
    run = run_placement_arm(sc, arm, 1)
    kinds = [k for _, _, _, k in run.counts.switch_log]
    assert kinds == ["unload", "load"]  # asleep at night, woken by the morning's first
    sleep, wake = bench.sim_transitions(run.counts.switch_log, 1.5, 0.01)
    step = bench.one_step_s(sc)
    f = bench.figures(run.records, sleep, wake, 1.0, step)
    assert f["wake_s"] == 1.5 and f["recovered_s"] <= f["bound_s"]
    assert f["gap_s"] >= 30.0


def test_the_live_cluster_places_the_same_engine(tmp_path: Path) -> None:
    bench = load("llm_placement_live")
    sc = load_llm_placement_scenario(SCENARIO)
    path, _, _ = bench.write_cluster(sc, "cost-aware", tmp_path)
    cluster = load_cluster(path)
    raw = yaml.safe_load(path.read_text())
    assert raw["gateway"]["placement"]["min_switch_s"] == 30.0
    infos, devices = cluster_setup(cluster, {})
    assert infos["llama-3.1-8b"] == _Pool(sc, "cost-aware", 1).infos["llama-3.1-8b"]
    assert [d.models for d in devices] == [("llama-3.1-8b",)]


def test_live_transitions_from_index_reads() -> None:
    bench = load("llm_placement_live")
    states = [(0.0, "READY"), (13.7, "UNLOADING"), (13.72, "UNAVAILABLE"), (50.05, "LOADING"),
              (51.56, "READY")]  # fmt: skip
    assert bench.live_transitions(states) == ((13.7, 13.72), (50.05, 51.56))
    # A sleep faster than a read: UNAVAILABLE straight from READY.
    assert bench.live_transitions([(0.0, "READY"), (13.75, "UNAVAILABLE")]) == (
        (13.75, 13.75),
        None,
    )
