"""The shipped seed scenario keeps the articles' qualitative result (shortened run)."""

from __future__ import annotations

from pathlib import Path

from evenserve.report.summary import summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario


def test_seed_scenario_shape_and_result(repo_root: Path) -> None:
    ld = load_scenario(repo_root / "scenarios" / "seed.yaml", ["duration_s=25", "warmup_s=5"])
    assert {"baseline", "optimized", "central-queue"} <= set(ld.scenario.arms)
    base = summarize(simulate(ld, "baseline"), timeseries=False)
    opt = summarize(simulate(ld, "optimized"), timeseries=False)
    util = {d: v["utilization"] for d, v in base["devices"].items()}
    # the articles' baseline shape: the BERT host saturated, the others about half busy
    assert util["gpu0"] >= 0.9
    assert all(0.4 <= util[d] <= 0.5 for d in ("gpu1", "gpu2", "gpu3"))
    assert base["utilization_spread_pts"] >= 40
    # the articles' result: lower P99, even devices, more throughput
    assert opt["latency_ms"]["p99"] < base["latency_ms"]["p99"]
    assert opt["utilization_spread_pts"] < base["utilization_spread_pts"]
    assert opt["throughput_rps"] > base["throughput_rps"]
