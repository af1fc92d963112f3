"""bench/llm_pools_night_live.py: the parts that need no live run (the scenario K times
slower, the cluster the live side runs, the arrivals both sides offer, the figures)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evenserve.cluster.file import load_cluster
from evenserve.core.profile import load_profile_set
from evenserve.experiment.llm_live import scale_profile_set
from evenserve.gateway.placement_catalogue import cluster_setup
from evenserve.sim.llm_placement import _Pool, run_placement_arm
from evenserve.sim.llm_placement_scenario import load_llm_placement_scenario
from evenserve.sim.placement import PlacementClock
from tests.unit.bench.bench_module import load

ROOT = Path(__file__).resolve().parents[3]
NIGHT = ROOT / "scenarios" / "llm-pools-night.yaml"
MORNING = ROOT / "scenarios" / "llm-morning-live.yaml"


def _scaled(tmp_path: Path, path: Path, k: float):  # type: ignore[no-untyped-def]
    bench = load("llm_pools_night_live")
    base = load_llm_placement_scenario(path)
    pdir = scale_profile_set(base.profile_dir(), tmp_path / "profiles", k)
    return bench, base, bench.scaled(base, k, pdir)


def test_the_scenario_k_times_slower(tmp_path: Path) -> None:
    bench, base, sc = _scaled(tmp_path, NIGHT, 2.0)
    d0, d = base.doc, sc.doc
    assert (d.duration_s, d.warmup_s, d.drain_s) == (1800.0, 40.0, 600.0)
    assert (d.llm.cold_load_ms, d.llm.warm_load_ms) == (40000.0, 3000.0)
    w = sc.workloads[0]
    assert w.rate_rps == 8.0 and (w.ttft_ms, w.tpot_ms) == (2000.0, 100.0)
    assert [(p.start_s, p.end_s) for p in w.phases][:2] == [(500.0, 560.0), (560.0, 1400.0)]
    c = {s.stream: s for s in d.classic}
    assert c["resnet50"].rate_rps == 300.0 and c["resnet50"].slo_ms == 100.0
    assert c["bert-batch"].slo_ms == 10000.0
    assert c["resnet50"].batching["max_batch_delay_ms"] == 4.0
    # A load time the scenario leaves to the weights is made explicit, then scaled.
    assert d0.classic[0].cold_load_ms is None and c["resnet50"].cold_load_ms is not None
    a0, a = d0.arms["cost-aware"], d.arms["cost-aware"]
    assert a.placement["hold_s"] == 60.0 and a.placement["idle_unload_s"] == 120.0
    assert a.placement["idle_rps"] == pytest.approx(0.05)  # the default 0.1, made explicit
    assert a.autoscaling["quiet_s"] == 60.0 and a.autoscaling["up_after_s"] == 2.0
    assert a.min_switch_s == 60.0 and a.placement_interval_ms == 2 * a0.placement_interval_ms
    assert [x.start_ms for x in a.devices] == [2 * x.start_ms for x in a0.devices]
    # The engine's step is K times longer; its placement (memory, capacity) reads the same.
    pool0, pool = _Pool(base, "cost-aware", 1), _Pool(sc, "cost-aware", 1)
    llm0, llm = pool0.infos["llama-3.1-8b"], pool.infos["llama-3.1-8b"]
    assert llm.device_bytes == llm0.device_bytes
    assert llm.warm_load_s == 2 * llm0.warm_load_s
    assert pool.run.step_profile.step_s(2048, 0, 0) == pytest.approx(
        2 * pool0.run.step_profile.step_s(2048, 0, 0)
    )
    assert bench.phase_edges(sc) == [0.0, 500.0, 560.0, 1400.0, 1560.0, 1600.0, 1800.0]


def test_the_live_cluster_places_what_the_simulator_places(tmp_path: Path) -> None:
    bench, _, sc = _scaled(tmp_path, NIGHT, 2.0)
    path = bench.write_cluster(sc, "cost-aware", tmp_path)
    raw = yaml.safe_load(path.read_text())
    gw = raw["gateway"]
    assert gw["placement"]["policy"] == "cost-aware" and gw["placement"]["min_switch_s"] == 60.0
    assert gw["autoscaling"]["policy"] == "demand"
    assert [d.get("active", True) for d in raw["workers"]["devices"]] == [
        True, True, False, False, False,
    ]  # fmt: skip
    infos, devices = cluster_setup(load_cluster(path), {"s": load_profile_set(sc.profile_dir())})
    pool = _Pool(sc, "cost-aware", 1)
    for m in ("llama-3.1-8b", "resnet50", "bert-base"):
        live, sim = infos[m], pool.infos[m]
        assert (live.weights_bytes, live.device_bytes) == (sim.weights_bytes, sim.device_bytes)
        assert (live.max_batch_size, live.slo_s) == (sim.max_batch_size, sim.slo_s)
        assert (live.cold_load_s, live.warm_load_s, live.batch_s) == pytest.approx(
            (sim.cold_load_s, sim.warm_load_s, sim.batch_s)
        )
    assert [d.memory_bytes for d in devices] == pytest.approx(
        [v.memory_bytes for v in pool.devs.values()]
    )


def test_both_sides_offer_the_same_arrivals_and_count_alike(tmp_path: Path) -> None:
    bench, _, sc = _scaled(tmp_path, MORNING, 1.0)
    run = run_placement_arm(sc, "cost-aware", 1)
    assert [r.arrival_s for r in bench.llm_requests(sc, 1)] == [r.scheduled_s for r in run.records]
    figs, decisions = bench.sim_side(sc, 1.0, "cost-aware", 1)
    assert figs["llm_requests"] == sum(
        1 for r in run.records if sc.doc.warmup_s <= r.scheduled_s < sc.doc.duration_s
    )
    assert figs["device_seconds"] == pytest.approx(run.device_seconds())
    assert figs["switches"] == 2 and figs["within_window"] == 0
    assert figs["shortest_switch_gap_s"] >= 30.0
    assert [d[2] for d in decisions] == ["unload", "load"]
    util = figs["utilization_by_phase"]["g0"]  # busy by day, nothing at night (asleep)
    assert len(util) == 3 and util[0] is not None and 0 < util[0] <= 1 and util[1] < util[0]
    m = figs["morning"]
    assert m is not None and m["first_at_s"] >= 50.0 and m["recovered_s"] < 3.0
    # The live gateway's clock replayed: its rebalances fall at 0.37 s + n s.
    _, replayed = bench.sim_side(sc, 1.0, "cost-aware", 1, PlacementClock(-3.0, 0.37, 0.37))
    sleep = next(d for d in replayed if d[2] == "unload")
    assert sleep[1] == "rebalance" and (sleep[0] - 0.37) % 1.0 == pytest.approx(0.0, abs=1e-6)
    assert sleep[0] != decisions[0][0]


def test_classic_arrivals_are_the_simulators(tmp_path: Path) -> None:
    bench, _, sc = _scaled(tmp_path, NIGHT, 4.0)
    # The first 50 scenario seconds: the day.
    short = type(sc)(sc.doc.model_copy(update={"duration_s": 200.0}), sc.source, sc.base_dir)
    arrivals = bench.classic_arrivals(short, 1)
    assert {a.stream for a in arrivals} == {"resnet50", "bert-base"}  # bert-batch: night only
    n = sum(1 for a in arrivals if a.stream == "resnet50")
    assert n == pytest.approx(150 * 200, rel=0.05)
    assert all(a.slo_s == 0.2 for a in arrivals)


def test_switch_figures_count_changes_closer_than_the_window() -> None:
    bench = load("llm_pools_night_live")
    switches = [[0.0, "a", "g0", "load"], [10.0, "b", "g0", "load"], [35.0, "a", "g0", "unload"],
                [50.0, "a", "g0", "load"]]  # fmt: skip
    f = bench.switch_figures(switches, 30.0)
    assert f == {"switches": 4, "shortest_switch_gap_s": 15.0, "within_window": 1}


def test_utilization_by_phase_averages_the_samples_where_a_device_was_on() -> None:
    bench = load("llm_pools_night_live")
    samples = [(1.0, {"g0": 0.2}), (2.0, {"g0": 0.4, "g1": 1.0}), (6.0, {"g1": 0.5})]
    assert bench.utilization_by_phase(samples, [0.0, 5.0, 10.0]) == {
        "g0": [pytest.approx(0.3), None],
        "g1": [1.0, 0.5],
    }
