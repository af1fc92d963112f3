"""The shipped priority-burst scenario: online keeps its SLO through the burst, only offline
work is shed, and offline work completes once the burst has passed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evenserve.report.summary import summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario


def test_priority_burst(repo_root: Path) -> None:
    ld = load_scenario(repo_root / "scenarios" / "priority-burst.yaml", ["duration_s=80"])
    rec = simulate(ld, "classes")
    s = summarize(rec)
    online, offline = s["classes"]["online"], s["classes"]["offline"]
    assert online["slo_attainment"] >= 0.999
    assert online["dropped"] == 0
    assert offline["dropped"] > 0  # the burst is more than the devices can serve
    assert set(offline["dropped_by_reason"]) <= {"queue-full", "shed"}
    # after the burst (40-50 s) offline throughput recovers above its arrival rate (285/s)
    per_s = s["timeseries"]["completions_by_class"]["offline"]
    t = np.asarray(s["timeseries"]["t_s"])
    during = np.mean([c for c, x in zip(per_s, t, strict=True) if 40 <= x < 50])
    after = np.mean([c for c, x in zip(per_s, t, strict=True) if 50 <= x < 60])
    assert during < 200 < 285 < after
    # and the FIFO baseline misses the online SLO in the same burst
    fifo = summarize(simulate(ld, "fifo"), timeseries=False)
    assert fifo["classes"]["online"]["slo_attainment"] < 0.99
