"""PNG plots of run summaries: per-device utilization over time, latency CDFs, queue depth.

Titles say what is drawn (which figure, its unit, which percentile); legends sit outside the
axes, right of the data, so they cover none of it. An arm whose devices were not measured
(a live run that scraped no backend) gets a panel saying so, not a flat 0 % line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _per_arm(
    summary: dict[str, Any], series: str, height: float, scale: float, ylabel: str, legend: str
) -> tuple[Figure, list[Any]]:
    """One panel per arm (in order), one line per device: ``timeseries[series]`` over time."""
    arms = summary["arms"]
    n = len(arms)
    fig, axes = plt.subplots(n, 1, figsize=(10, height * n), sharex=True, squeeze=False)
    for ax, a in zip(axes[:, 0], arms.values(), strict=True):
        ts = a.get("timeseries") or {}
        t = ts.get("t_s", [])
        lines = ts.get(series, {})
        for dev, values in lines.items():
            ax.plot(t[: len(values)], [scale * x for x in values], label=dev, linewidth=1)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=legend)
        else:
            ax.text(
                0.5,
                0.5,
                "not measured: no backend scraped",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="gray",
            )
    axes[-1, 0].set_xlabel("time since the start of the run (s)")
    return fig, list(axes[:, 0])


def plot_utilization(summary: dict[str, Any], out: Path) -> Path:
    fig, axes = _per_arm(summary, "utilization", 2.6, 100.0, "busy %", "device")
    for ax, (name, a) in zip(axes, summary["arms"].items(), strict=True):
        ax.set_ylim(0, 105)
        spread = a.get("utilization_spread_pts")
        ax.set_title(
            f"{name}: {a['routing']} + {a['batching']}  "
            + (
                f"(busiest - idlest: {spread:.1f} pts)"
                if spread is not None
                else "(utilization not measured)"
            ),
            fontsize=9,
        )
    fig.suptitle(
        f"{summary['scenario']}: busy % per device over time (per-interval mean)", fontsize=11
    )
    return _save(fig, out / "utilization.png")


def plot_latency_cdf(summary: dict[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, a in summary["arms"].items():
        q = a.get("latency_cdf_ms") or []
        if not q:
            continue
        frac = [i / (len(q) - 1) for i in range(len(q))]
        ax.plot(q, frac, label=f"{name} (P99 {a['latency_ms']['p99']:.1f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of requests at or below")
    ax.set_title(f"{summary['scenario']}: latency CDF per arm (completed, after warm-up)")
    ax.grid(alpha=0.3, which="both")
    if ax.get_lines():
        ax.legend(fontsize=8, loc="lower right")
    return _save(fig, out / "latency_cdf.png")


def plot_queue_depth(summary: dict[str, Any], out: Path) -> Path:
    fig, axes = _per_arm(summary, "queue_depth", 2.4, 1.0, "requests queued", "device")
    for ax, (name, a) in zip(axes, summary["arms"].items(), strict=True):
        ax.set_title(
            f"{name}: requests queued per device, per-interval mean of samples "
            f"(max sample {a['max_queue_depth']:.0f})",
            fontsize=9,
        )
    return _save(fig, out / "queue_depth.png")


def write_plots(summary: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_utilization(summary, out),
        plot_latency_cdf(summary, out),
        plot_queue_depth(summary, out),
    ]
