"""scenarios/many-models.yaml, shortened, with the test placement policy standing in for the
real ones (lru, cost-aware, demand: merged from the placement policies branch)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import tests.placement_policies  # noqa: F401  (registers the test policies)
from evenserve.core.errors import ConfigError
from evenserve.policy.placement import PLACEMENT
from evenserve.report.summary import run_summary, summarize
from evenserve.report.table import compare_table_rows
from evenserve.sim.cluster import Simulation
from evenserve.sim.loader import load_scenario

GIB = 1024.0**3
STAND_IN = [
    "duration_s=20",
    "warmup_s=2",
    "arms.lru.placement=test-fit-or-evict",
    "arms.cost-aware.placement=test-fit-or-evict",
    "arms.cost-aware.autoscaling=null",
    "arms.lru.autoscaling=null",
]


def test_the_scenario_names_the_real_policies(repo_root: Path) -> None:
    path = repo_root / "scenarios" / "many-models.yaml"
    if "lru" in PLACEMENT.names():
        load_scenario(path)  # merged: it loads as it is
    else:
        with pytest.raises(ConfigError, match="unknown placement policy 'lru'"):
            load_scenario(path)


def test_many_models_runs_with_a_stand_in_policy(repo_root: Path) -> None:
    ld = load_scenario(repo_root / "scenarios" / "many-models.yaml", STAND_IN)
    sc = ld.scenario
    assert len(sc.models) == 24
    weights = {m: ld.profile_of(sc.expanded_devices()[0], m).weights_bytes for m in sc.models}
    pool = [d for d in sc.arm_devices("lru") if d.active]
    assert sum(weights.values()) > sum(d.memory_gb * GIB for d in pool)  # not all fit
    assert sorted(w / GIB for w in weights.values())[-2:] == [8.0, 8.0]

    static = Simulation(ld, "static")  # the tight static: sized with batching
    rec = static.run()
    assert rec.device_seconds == pytest.approx(6 * 20.0)
    assert rec.evictions == 0 and rec.loads == 0
    assert Simulation(ld, "static-b1").run().device_seconds == pytest.approx(11 * 20.0)
    static_summary = summarize(rec, timeseries=False)

    lru = Simulation(ld, "lru")
    rec = lru.run()
    s = summarize(rec, timeseries=False)
    assert rec.device_seconds == pytest.approx(4 * 20.0)
    assert rec.loads >= 2  # t08 and t09 start cold
    assert s["load_wait"]["requests"] > 0
    # resident against cold: the cold requests are those that waited for a load
    assert s["evictions_per_load"] == pytest.approx(rec.evictions / rec.loads, abs=1e-6)
    assert s["cold"]["requests"] == s["load_wait"]["requests"]
    assert "slo_attainment" in s["resident"] and "slo_attainment" not in static_summary.get(
        "resident", {}
    )
    bound = {m: rec.load_bound_s[m] for m in ("t08", "t09")}
    assert bound["t08"] == pytest.approx(2 * GIB / 2e9 + 0.05 + 2 * 0.04356, rel=1e-3)
    if s["cold"]["p99_of_bound"] is not None:
        assert s["cold"]["p99_of_bound"] > 0
    assert lru.placement is not None
    for pd in lru.placement.devices.values():
        assert pd.peak_weights_bytes <= pd.spec.memory_gb * GIB
    log = rec.requests
    for fin, reason in zip(log.finish_s, log.drop_reason, strict=True):
        assert not (not math.isnan(fin) and reason is not None)

    # The comparison shows the cost and what misses cost, and every arm's devices.
    header, rows = compare_table_rows(run_summary(sc.name, 1, {"static": static_summary, "lru": s}))
    by = {r[0]: r[1:] for r in rows}
    assert header == ["figure", "static", "lru"]
    assert by["device-seconds"] == ["120", "80"]
    assert by["evictions"][0] == "0" and by["loads"][1] == str(s["loads"])
    assert by["util s0"][1] == "-" and by["util g0"][0] == "-"
