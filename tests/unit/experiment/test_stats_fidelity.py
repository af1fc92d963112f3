"""Repeats' statistics, the headline repeat, and fidelity against the simulator."""

from __future__ import annotations

from typing import Any

import pytest

from evenserve.experiment.fidelity import FIDELITY_TOLERANCE, fidelity
from evenserve.experiment.stats import headline, repeat_stats, scalar_figures
from evenserve.experiment.tables import fidelity_rows


def arm(
    p50: float | None, p99: float | None, tput: float, util: dict[str, float]
) -> dict[str, Any]:
    return {
        "latency_ms": {"p50": p50, "p99": p99},
        "throughput_rps": tput,
        "utilization_mean": sum(util.values()) / len(util),
        "utilization_spread_pts": 100 * (max(util.values()) - min(util.values())),
        "max_queue_depth": 3.0,
        "devices": {d: {"utilization": u} for d, u in util.items()},
    }


def test_scalar_figures() -> None:
    figs = scalar_figures(arm(1.0, 2.0, 30.0, {"g0": 0.5, "g1": 0.25}))
    assert figs == {
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "throughput_rps": 30.0,
        "utilization_mean": 0.375,
        "utilization_spread_pts": 25.0,
        "max_queue_depth": 3.0,
        "util g0": 0.5,
        "util g1": 0.25,
    }


def test_repeat_stats() -> None:
    runs = [arm(10.0, 40.0, 100.0, {"g": 0.5}), arm(12.0, None, 110.0, {"g": 0.7})]
    st = repeat_stats(runs)
    assert st["p50_ms"] == {
        "mean": 11.0,
        "sd": pytest.approx(1.414214),
        "min": 10.0,
        "max": 12.0,
        "n": 2,
    }
    assert st["p99_ms"] == {"mean": 40.0, "sd": 0.0, "min": 40.0, "max": 40.0, "n": 1}
    assert st["util g"]["mean"] == pytest.approx(0.6)
    none = repeat_stats([arm(None, None, 1.0, {"g": 0.1})])
    assert none["p50_ms"] == {"mean": None, "sd": None, "min": None, "max": None, "n": 0}


def test_headline_is_the_median_p99_repeat() -> None:
    runs = [arm(1, p99, 1, {"g": 0.1}) for p99 in (30.0, 10.0, None, 20.0)]
    assert headline(runs) is runs[3]  # 10, 20, 30, None (last): the lower median is 20
    assert headline(runs[:3]) is runs[0]
    assert headline(runs[1:2]) is runs[1]


def test_fidelity_per_figure() -> None:
    live = repeat_stats([arm(11.0, 50.0, 95.0, {"g0": 0.5, "g1": 0.0})])
    sim = repeat_stats([arm(10.0, 40.0, 100.0, {"g0": 0.5, "g1": 0.0})])
    fid = fidelity({"a": live, "only-live": live}, {"a": sim})
    assert list(fid) == ["a"]  # no simulated counterpart, no row
    rows = fid["a"]
    assert set(rows) == {"p50_ms", "p99_ms", "throughput_rps", "util g0", "util g1"}
    assert rows["p50_ms"] == {
        "live": 11.0,
        "simulated": 10.0,
        "rel_error": 0.1,
        "abs_error": None,
        "error": "relative",
        "checked": True,
        "within": True,
    }
    assert rows["p99_ms"]["rel_error"] == 0.25 and rows["p99_ms"]["within"] is False
    assert rows["throughput_rps"]["checked"] is False and rows["throughput_rps"]["within"]
    assert rows["util g0"]["rel_error"] == 0.0 and rows["util g0"]["checked"]
    assert rows["util g1"]["rel_error"] is None and rows["util g1"]["within"] is None
    header, table, marks = fidelity_rows(fid)
    assert header[-1] == f"within {100 * FIDELITY_TOLERANCE:g} %" == "within 15 %"
    by_fig = {r[1]: (i, r) for i, r in enumerate(table)}
    i, p99 = by_fig["p99_ms"]
    assert p99 == ["a", "p99_ms", "50.00", "40.00", "+25.0 %", "NO"] and marks[(i, 5)] == "bad"
    i, util = by_fig["util g0"]
    assert util[2:] == ["50.00 %", "50.00 %", "+0.0 %", "yes"] and marks[(i, 5)] == "good"
    assert by_fig["throughput_rps"][1][5] == "" and (by_fig["throughput_rps"][0], 5) not in marks
    assert (by_fig["util g1"][0], 5) not in marks


def placed(p99: float, dev_s: float, evictions: int, loads: int) -> dict[str, Any]:
    a = arm(10.0, p99, 100.0, {"g0": 0.5})
    a.update(device_seconds=dev_s, evictions=evictions, loads=loads, scale_up_decision_s=1.5)
    return a


def test_placement_figures_in_the_fidelity_table() -> None:
    """device_seconds and evictions are checked on placement arms: relative error, but an
    absolute difference (within 1) for counts below 10 on both sides."""
    live = {
        "lru": repeat_stats([placed(40.0, 230.0, 42, 45)]),
        "few": repeat_stats([placed(40.0, 160.0, 3, 4)]),
        "off": repeat_stats([placed(40.0, 160.0, 30, 4)]),
    }
    sim = {
        "lru": repeat_stats([placed(40.0, 200.0, 40, 44)]),
        "few": repeat_stats([placed(40.0, 161.0, 5, 4)]),
        "off": repeat_stats([placed(40.0, 160.0, 9, 4)]),
    }
    fid = fidelity(live, sim, placement_arms=["lru", "few"])
    lru = fid["lru"]
    assert lru["device_seconds"]["rel_error"] == 0.15 and lru["device_seconds"]["within"]
    assert lru["device_seconds"]["checked"] and lru["evictions"]["checked"]
    assert lru["evictions"]["rel_error"] == 0.05 and lru["evictions"]["error"] == "relative"
    assert lru["loads"]["checked"] is False  # shown
    assert lru["scale_up_decision_s"]["rel_error"] == 0.0
    few = fid["few"]["evictions"]
    assert (few["error"], few["abs_error"], few["rel_error"], few["within"]) == (
        "absolute",
        -2.0,
        None,
        False,
    )
    assert fid["few"]["loads"]["abs_error"] == 0.0 and fid["few"]["loads"]["within"]
    # 30 vs 9: not both small, so relative; not a placement arm, so not checked.
    off = fid["off"]["evictions"]
    assert off["error"] == "relative" and off["checked"] is False and off["within"] is False
    _, table, marks = fidelity_rows(fid)
    by = {(r[0], r[1]): (i, r) for i, r in enumerate(table)}
    i, row = by[("few", "evictions")]
    assert row[4:] == ["-2 (abs.)", "NO"] and marks[(i, 5)] == "bad"
    i, row = by[("lru", "device_seconds")]
    assert row[2:] == ["230.00", "200.00", "+15.0 %", "yes"]
