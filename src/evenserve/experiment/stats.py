"""Figures across the repeats of one arm: the scalar figures, their spread, the headline run."""

from __future__ import annotations

import math
import statistics
from typing import Any

#: One figure's spread over repeats: mean, sd, min, max (None when no repeat had it), n.
FigureStats = dict[str, float | None]


def scalar_figures(arm: dict[str, Any]) -> dict[str, float | None]:
    """The figures of one run's summary that repeats and fidelity compare."""
    out: dict[str, float | None] = {
        "p50_ms": arm["latency_ms"]["p50"],
        "p99_ms": arm["latency_ms"]["p99"],
        "throughput_rps": arm["throughput_rps"],
        "utilization_mean": arm["utilization_mean"],
        "utilization_spread_pts": arm["utilization_spread_pts"],
        "max_queue_depth": arm["max_queue_depth"],
    }
    # Placement figures (a live run's from the gateway's metrics), where the run has them.
    for key in (
        "device_seconds",
        "loads",
        "evictions",
        "scale_up_after_burst_s",
        "scale_up_decision_s",
    ):
        if key in arm:
            out[key] = arm[key]
    for d, v in arm["devices"].items():
        out[f"util {d}"] = v["utilization"]
    return out


def repeat_stats(summaries: list[dict[str, Any]]) -> dict[str, FigureStats]:
    """Mean, standard deviation, min and max of each scalar figure over repeats."""
    figs = [scalar_figures(s) for s in summaries]
    out: dict[str, FigureStats] = {}
    for key in figs[0]:
        vals = [float(v) for f in figs if (v := f.get(key)) is not None]
        if not vals:
            out[key] = {"mean": None, "sd": None, "min": None, "max": None, "n": 0}
            continue
        out[key] = {
            "mean": round(statistics.fmean(vals), 6),
            "sd": round(statistics.stdev(vals), 6) if len(vals) > 1 else 0.0,
            "min": round(min(vals), 6),
            "max": round(max(vals), 6),
            "n": len(vals),
        }
    return out


def headline(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeat with the median P99 stands for the arm in tables and plots."""
    order = sorted(summaries, key=lambda s: s["latency_ms"]["p99"] or math.inf)
    return order[(len(order) - 1) // 2]
