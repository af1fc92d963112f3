"""bench/llm_pools_night.py and its scenario: the parts that need no long run."""

from __future__ import annotations

from pathlib import Path

import pytest

from evenserve.sim.llm_placement import _Pool
from evenserve.sim.llm_placement_scenario import load_llm_placement_scenario
from tests.unit.bench.bench_module import load

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "scenarios" / "llm-pools-night.yaml"
GIB = 1024.0**3


def test_the_scenario_validates_and_places_the_engine_at_weights_plus_kv() -> None:
    sc = load_llm_placement_scenario(SCENARIO)
    assert set(sc.doc.arms) >= {"cost-aware", "static-2", "static-3"}
    pool = _Pool(sc, "cost-aware", 1)
    llm = pool.infos["llama-3.1-8b"]
    # 131072 tokens x 128 KiB = 16 GiB of KV next to 14.96 GiB of weights.
    assert llm.kv_bytes == 16 * GIB
    assert llm.device_bytes == pytest.approx(30.96 * GIB)
    assert pool.ctl.min_switch_s == 30.0
    assert (llm.warm_load_s, llm.cold_load_s) == (1.5, 20.0)


def test_the_bench_builds_static_layouts_of_every_model_on_each_device() -> None:
    bench = load("llm_pools_night")
    arm = bench.static_arm(SCENARIO, 3)
    assert [d["name"] for d in arm["devices"]] == ["s0", "s1", "s2"]
    assert all(
        d["models"] == ["llama-3.1-8b", "resnet50", "bert-base"] and d["active"]
        for d in arm["devices"]
    )
    assert arm["placement"] == "static" and arm["autoscaling"] is None
